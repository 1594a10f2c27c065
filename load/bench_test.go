package load

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/multiprobe/multiprobe/internal/testutil"
)

// BenchmarkLoad loads the skewed set of 20 programs (one dominant, five
// medium, fourteen small) one by one with cilium's NewCollection, then
// concurrently in given order, longest first by instruction count, and
// longest first by cost cached from the previous iteration. The custom
// metrics are per phase: makespan, lower bound max(longest, work/CPUs), and
// their ratio.
func BenchmarkLoad(b *testing.B) {
	testutil.RequireBPF(b)
	spec := collectionOf(skewedSet())

	b.Run("sequential", func(b *testing.B) {
		for b.Loop() {
			coll, err := ebpf.NewCollection(spec)
			if err != nil {
				b.Fatal(err)
			}
			coll.Close()
		}
	})

	costs := NewCostCache("")
	if coll, _, err := Collection(spec, &Options{Costs: costs}); err != nil {
		b.Fatal(err)
	} else {
		coll.Close()
	}
	for _, order := range []Order{OrderGiven, OrderLPT, OrderCached} {
		b.Run(order.String(), func(b *testing.B) {
			var makespan, bound, work time.Duration
			n := 0
			for b.Loop() {
				coll, prof, err := Collection(spec, &Options{Order: order, Costs: costs})
				if err != nil {
					b.Fatal(err)
				}
				coll.Close()
				makespan += prof.Makespan
				bound += prof.LowerBound
				work += prof.Work
				n++
			}
			b.ReportMetric(float64(makespan.Milliseconds())/float64(n), "makespan-ms")
			b.ReportMetric(float64(bound.Milliseconds())/float64(n), "bound-ms")
			b.ReportMetric(float64(work.Milliseconds())/float64(n), "work-ms")
			b.ReportMetric(float64(makespan)/float64(bound), "x-bound")
		})
	}
}

// btfSet returns n programs whose loads look their target up in kernel BTF.
func btfSet(n int) *ebpf.CollectionSpec {
	specs := make([]*ebpf.ProgramSpec, n)
	for i := range specs {
		specs[i] = btfProgram(fmt.Sprintf("tp_btf%02d", i))
	}
	return collectionOf(specs)
}

// BenchmarkKernelBTF loads 1 and 20 programs that need kernel BTF, each
// phase with a fresh BTF cache, and, for contrast, 20 programs through
// cilium's per-collection cache one program at a time (what loading them
// without a shared cache costs).
func BenchmarkKernelBTF(b *testing.B) {
	testutil.RequireBPF(b)
	for _, n := range []int{1, 20} {
		spec := btfSet(n)
		b.Run(fmt.Sprintf("shared/programs=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			var btfTime time.Duration
			for b.Loop() {
				coll, prof, err := Collection(spec, nil)
				if err != nil {
					b.Fatal(err)
				}
				coll.Close()
				btfTime += prof.BTF
			}
			b.ReportMetric(float64(btfTime.Microseconds())/1000/float64(b.N), "btf-ms")
		})
	}
	b.Run("unshared/programs=20", func(b *testing.B) {
		b.ReportAllocs()
		spec := btfSet(20)
		for b.Loop() {
			for name := range spec.Programs {
				one := &ebpf.CollectionSpec{Maps: spec.Maps, Programs: map[string]*ebpf.ProgramSpec{name: spec.Programs[name]}}
				coll, err := ebpf.NewCollection(one)
				if err != nil {
					b.Fatal(err)
				}
				coll.Close()
			}
		}
	})
}

// plainSet returns n programs like btfSet's that need no kernel BTF.
func plainSet(n int) *ebpf.CollectionSpec {
	cs := btfSet(n)
	for name, p := range cs.Programs {
		p = p.Copy()
		p.Type, p.AttachType, p.AttachTo = ebpf.SocketFilter, ebpf.AttachNone, ""
		cs.Programs[name] = p
	}
	return cs
}

// BenchmarkKernelBTFRatio reports how a load phase's kernel BTF work grows
// from 1 to 20 programs that need kernel BTF. The BTF share of allocations
// is the phase's allocations minus those of the same programs needing no
// BTF; with BTF parsed once per phase the ratios stay near 1.
func BenchmarkKernelBTFRatio(b *testing.B) {
	testutil.RequireBPF(b)
	measure := func(spec *ebpf.CollectionSpec) (allocs, bytes float64) {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		coll, _, err := Collection(spec, nil)
		runtime.ReadMemStats(&after)
		if err != nil {
			b.Fatal(err)
		}
		coll.Close()
		return float64(after.Mallocs - before.Mallocs), float64(after.TotalAlloc - before.TotalAlloc)
	}
	sets := []*ebpf.CollectionSpec{btfSet(1), plainSet(1), btfSet(20), plainSet(20)}
	var allocs, bytes [4]float64
	for b.Loop() {
		for i, s := range sets {
			a, by := measure(s)
			allocs[i] += a
			bytes[i] += by
		}
	}
	b.ReportMetric(bytes[2]/bytes[0], "bytes-20/1")
	b.ReportMetric(allocs[2]/allocs[0], "allocs-20/1")
	b.ReportMetric((bytes[2]-bytes[3])/(bytes[0]-bytes[1]), "btf-bytes-20/1")
	b.ReportMetric((allocs[2]-allocs[3])/(allocs[0]-allocs[1]), "btf-allocs-20/1")
}
