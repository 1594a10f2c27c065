package load

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/multiprobe/multiprobe/probetest"
)

// BenchmarkLoad loads the skewed set of 20 programs (one dominant, five
// medium, fourteen small) one by one with cilium's NewCollection, then
// concurrently in given order, longest first by instruction count, and
// longest first by cost cached from the previous iteration. The custom
// metrics are per phase: makespan, lower bound max(longest, work/CPUs), and
// their ratio.
func BenchmarkLoad(b *testing.B) {
	probetest.RequireBPF(b)
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
			var sum profileSum
			for b.Loop() {
				coll, prof, err := Collection(spec, &Options{Order: order, Costs: costs})
				if err != nil {
					b.Fatal(err)
				}
				coll.Close()
				sum.add(prof)
			}
			sum.report(b)
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
	probetest.RequireBPF(b)
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
// from 1 to 20 programs that need kernel BTF (tp_btf programs, each of
// which looks its target up in kernel BTF):
//
//   - btf-allocs-20/1, btf-bytes-20/1: allocations made in package btf
//     (any frame of the allocating stack), from the heap profile at rate 1:
//     parsing kernel BTF and looking types up in it.
//   - unshared-btf-allocs-20/1: the same for the 20 programs loaded in
//     20 phases, which parse kernel BTF 20 times: what the measure sees
//     when nothing is shared.
//   - phase-allocs-20/1, phase-bytes-20/1: all the phase's allocations
//     minus those of the same programs as socket filters, which need no
//     BTF. This also counts what cilium/ebpf does per program around its
//     lookup of the attach target (formatting the target's names), which
//     no loader can share through its API.
//
// With kernel BTF parsed once per phase the ratios stay near 1.
func BenchmarkKernelBTFRatio(b *testing.B) {
	probetest.RequireBPF(b)
	load := func(spec *ebpf.CollectionSpec) {
		coll, _, err := Collection(spec, nil)
		if err != nil {
			b.Fatal(err)
		}
		coll.Close()
	}
	phase := func(spec *ebpf.CollectionSpec) (allocs, bytes float64) {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		load(spec)
		runtime.ReadMemStats(&after)
		return float64(after.Mallocs - before.Mallocs), float64(after.TotalAlloc - before.TotalAlloc)
	}
	sets := []*ebpf.CollectionSpec{btfSet(1), plainSet(1), btfSet(20), plainSet(20)}
	var allocs, bytes [4]float64
	var btfAllocs, btfBytes [2]float64
	var unshared float64
	for b.Loop() {
		// For contrast: the 20 programs loaded one phase each, so each
		// parses kernel BTF anew.
		a, _ := allocsIn("github.com/cilium/ebpf/btf.", func() {
			for name, p := range sets[2].Programs {
				load(&ebpf.CollectionSpec{Maps: sets[2].Maps, Programs: map[string]*ebpf.ProgramSpec{name: p}})
			}
		})
		unshared += a
		for i, s := range sets {
			a, by := phase(s)
			allocs[i] += a
			bytes[i] += by
		}
		for i, s := range []*ebpf.CollectionSpec{sets[0], sets[2]} {
			a, by := allocsIn("github.com/cilium/ebpf/btf.", func() { load(s) })
			btfAllocs[i] += a
			btfBytes[i] += by
		}
	}
	b.ReportMetric(btfAllocs[0]/float64(b.N), "btf-allocs-1")
	b.ReportMetric(btfAllocs[1]/float64(b.N), "btf-allocs-20")
	b.ReportMetric(btfAllocs[1]/btfAllocs[0], "btf-allocs-20/1")
	b.ReportMetric(unshared/btfAllocs[0], "unshared-btf-allocs-20/1")
	b.ReportMetric(btfBytes[1]/btfBytes[0], "btf-bytes-20/1")
	b.ReportMetric((allocs[2]-allocs[3])/(allocs[0]-allocs[1]), "phase-allocs-20/1")
	b.ReportMetric((bytes[2]-bytes[3])/(bytes[0]-bytes[1]), "phase-bytes-20/1")
}

// allocsIn runs f and returns the objects and bytes it allocated with a
// function whose name starts with prefix on the stack. It samples every
// allocation while f runs, and reads the heap profile after enough
// collections that it holds all of them.
func allocsIn(prefix string, f func()) (objects, bytes float64) {
	defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
	runtime.MemProfileRate = 1
	before := heapProfile()
	f()
	after := heapProfile()
	matches := map[[32]uintptr]bool{}
	for stack, a := range after {
		in, ok := matches[stack]
		if !ok {
			frames := runtime.CallersFrames(stack[:])
			for {
				fr, more := frames.Next()
				if strings.HasPrefix(fr.Function, prefix) {
					in = true
					break
				}
				if !more {
					break
				}
			}
			matches[stack] = in
		}
		if in {
			objects += float64(a[0] - before[stack][0])
			bytes += float64(a[1] - before[stack][1])
		}
	}
	return objects, bytes
}

// heapProfile returns the allocations so far, objects and bytes, by stack.
func heapProfile() map[[32]uintptr][2]int64 {
	// The profile lags by up to two collections.
	for range 3 {
		runtime.GC()
	}
	var recs []runtime.MemProfileRecord
	for {
		n, ok := runtime.MemProfile(recs, true)
		if ok {
			recs = recs[:n]
			break
		}
		recs = make([]runtime.MemProfileRecord, n+64)
	}
	m := make(map[[32]uintptr][2]int64, len(recs))
	for _, r := range recs {
		c := m[r.Stack0]
		m[r.Stack0] = [2]int64{c[0] + r.AllocObjects, c[1] + r.AllocBytes}
	}
	return m
}

// profileSum adds up the Profiles of a benchmark's loads, to report them
// per load.
type profileSum struct {
	makespan, bound, work time.Duration
	n                     int
}

func (s *profileSum) add(p *Profile) {
	s.makespan += p.Makespan
	s.bound += p.LowerBound
	s.work += p.Work
	s.n++
}

// report gives the mean makespan, lower bound max(longest, work/CPUs) and
// work, and the makespan over the bound.
func (s *profileSum) report(b *testing.B) {
	n := float64(s.n)
	b.ReportMetric(float64(s.makespan.Milliseconds())/n, "makespan-ms")
	b.ReportMetric(float64(s.bound.Milliseconds())/n, "bound-ms")
	b.ReportMetric(float64(s.work.Milliseconds())/n, "work-ms")
	b.ReportMetric(float64(s.makespan)/float64(s.bound), "x-bound")
}
