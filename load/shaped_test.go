package load

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/multiprobe/multiprobe/probetest"
)

// shapedProgram is skewedProgram of the given type that ends by tail-calling
// slot of the prog array "jmp" (slot < 0: no tail call). The context is kept
// in R6 for the call.
func shapedProgram(name string, typ ebpf.ProgramType, slot, iters, body, diamonds int) *ebpf.ProgramSpec {
	p := skewedProgram(name, iters, body, diamonds)
	p.Type = typ
	insns := append(asm.Instructions{asm.Mov.Reg(asm.R6, asm.R1)}, p.Instructions[:len(p.Instructions)-2]...)
	if slot >= 0 {
		insns = append(insns,
			asm.Mov.Reg(asm.R1, asm.R6),
			asm.LoadMapPtr(asm.R2, 0).WithReference("jmp"),
			asm.Mov.Imm(asm.R3, int32(slot)),
			asm.FnTailCall.Call(),
		)
	}
	insns = append(insns, asm.Mov.Imm(asm.R0, 0).WithSymbol("out"), asm.Return())
	p.Instructions = insns
	return p
}

// shapedSpec is shaped like the object issue 13 was found on: two tail-call
// groups of different program types (kprobe and perf_event) sharing one
// prog array "jmp", each entry program calling its own group's unwinders,
// skewed costs and two programs far heavier than the rest. broken makes
// one perf_event entry fail after its verification passed (see shapedBroken).
func shapedSpec() *ebpf.CollectionSpec {
	type p struct{ iters, body, diamonds int }
	group := func(prefix string, typ ebpf.ProgramType, slots [2]int, costs []p) []*ebpf.ProgramSpec {
		var progs []*ebpf.ProgramSpec
		for i, s := range slots {
			// Unwinders: tail-call targets, which call nothing further.
			progs = append(progs, shapedProgram(fmt.Sprintf("%s_unwind%d", prefix, i), typ, -1, 200, 40, 2))
			_ = s
		}
		for i, c := range costs {
			progs = append(progs, shapedProgram(fmt.Sprintf("%s_entry%02d", prefix, i), typ, slots[i%2], c.iters, c.body, c.diamonds))
		}
		return progs
	}
	kp := group("kp", ebpf.Kprobe, [2]int{0, 1}, []p{
		{40, 20, 1}, {60, 30, 0}, {30, 50, 1}, {50, 40, 0}, {20, 60, 1},
		{80, 25, 0}, {40, 45, 1}, {400, 60, 2},
		{1200, 120, 4}, // heavy
	})
	pe := group("pe", ebpf.PerfEvent, [2]int{2, 3}, []p{
		{70, 35, 0}, {25, 55, 1}, {90, 20, 0}, {45, 40, 1}, {55, 30, 0},
		{5, 320, 0}, {5, 300, 0}, {450, 70, 2}, {350, 80, 2},
		{1300, 110, 4}, // heavy
	})
	cs := collectionOf(append(kp, pe...))
	cs.Maps["jmp"] = &ebpf.MapSpec{
		Name: "jmp", Type: ebpf.ProgramArray, KeySize: 4, ValueSize: 4, MaxEntries: 4,
		Contents: []ebpf.MapKV{
			{Key: uint32(0), Value: "kp_unwind0"}, {Key: uint32(1), Value: "kp_unwind1"},
			{Key: uint32(2), Value: "pe_unwind0"}, {Key: uint32(3), Value: "pe_unwind1"},
		},
	}
	return cs
}

// TestShapedSplitLoads loads the two-group object with SplitTailCallMaps and
// checks what the kernel holds: every program loaded, each group's prog
// array holds exactly its own unwinders (by program id), under the copy the
// profile names.
func TestShapedSplitLoads(t *testing.T) {
	probetest.RequireBPF(t)
	spec := shapedSpec()
	if _, _, err := Collection(spec, nil); !errors.Is(err, ErrTailCallMix) {
		t.Fatalf("without SplitTailCallMaps: err = %v, want ErrTailCallMix", err)
	}
	coll, prof, err := Collection(spec, &Options{SplitTailCallMaps: true})
	if err != nil {
		t.Fatal(err)
	}
	defer coll.Close()
	if len(coll.Programs) != len(spec.Programs) {
		t.Fatalf("%d programs loaded, want %d", len(coll.Programs), len(spec.Programs))
	}
	// The two heavy programs are the two longest loads by far: the shape
	// the benchmark needs.
	byTime := slices.SortedFunc(slices.Values(prof.Programs), func(a, b ProgramProfile) int { return cmp.Compare(b.Verify, a.Verify) })
	for i, pp := range byTime[:3] {
		t.Logf("%d: %s %v (%d verified)", i, pp.Name, pp.Verify, pp.Verified)
	}
	if heavy := map[string]bool{byTime[0].Name: true, byTime[1].Name: true}; !heavy["kp_entry08"] || !heavy["pe_entry09"] || byTime[2].Verified*3 > byTime[1].Verified {
		t.Errorf("the longest loads are %s, %s, %s: the heavy programs are not far heavier", byTime[0].Name, byTime[1].Name, byTime[2].Name)
	}
	copyOf := map[string]string{}
	for _, c := range prof.MapCopies {
		for _, p := range c.Programs {
			copyOf[p] = c.Copy
		}
	}
	for _, g := range []struct {
		unwinders [2]string
		entry     string
		slots     [2]uint32
	}{
		{[2]string{"kp_unwind0", "kp_unwind1"}, "kp_entry00", [2]uint32{0, 1}},
		{[2]string{"pe_unwind0", "pe_unwind1"}, "pe_entry00", [2]uint32{2, 3}},
	} {
		name := copyOf[g.entry]
		m := coll.Maps[name]
		if m == nil {
			t.Fatalf("%s: no copy of jmp in the collection (copies %+v)", g.entry, prof.MapCopies)
		}
		if copyOf[g.unwinders[0]] != name {
			t.Errorf("%s uses %q but its unwinder uses %q", g.entry, name, copyOf[g.unwinders[0]])
		}
		for i, slot := range g.slots {
			var id uint32
			if err := m.Lookup(slot, &id); err != nil {
				t.Fatalf("%s[%d]: %v", name, slot, err)
			}
			info, err := coll.Programs[g.unwinders[i]].Info()
			if err != nil {
				t.Fatal(err)
			}
			want, _ := info.ID()
			if ebpf.ProgramID(id) != want {
				t.Errorf("%s[%d] holds program %d, want %s (%d)", name, slot, id, g.unwinders[i], want)
			}
		}
		// The other group's slots are empty in this copy.
		for _, slot := range []uint32{0, 1, 2, 3} {
			if slot == g.slots[0] || slot == g.slots[1] {
				continue
			}
			var id uint32
			if err := m.Lookup(slot, &id); !errors.Is(err, ebpf.ErrKeyNotExist) {
				t.Errorf("%s[%d] = %d, %v; want empty", name, slot, id, err)
			}
		}
	}
}

// kprobeOwned returns a prog array whose owner the kernel set to kprobe, by
// loading a kprobe program that tail-calls through it.
func kprobeOwned(t testing.TB) *ebpf.Map {
	ms := &ebpf.MapSpec{Name: "jmp", Type: ebpf.ProgramArray, KeySize: 4, ValueSize: 4, MaxEntries: 4}
	jmp, err := ebpf.NewMap(ms)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { jmp.Close() })
	owner := shapedProgram("owner", ebpf.Kprobe, 0, 1, 1, 0)
	cs := collectionOf([]*ebpf.ProgramSpec{owner})
	cs.Maps["jmp"] = ms
	coll, err := ebpf.NewCollectionWithOptions(cs, ebpf.CollectionOptions{MapReplacements: map[string]*ebpf.Map{"jmp": jmp}})
	if err != nil {
		t.Fatal(err)
	}
	coll.Close() // the map keeps its owner type
	return jmp
}

// TestAfterVerificationReported loads a perf_event program against a prog
// array a kprobe program owns: the verifier accepts it, the kernel refuses
// it, and the error must say exactly that.
func TestAfterVerificationReported(t *testing.T) {
	probetest.RequireBPF(t)
	jmp := kprobeOwned(t)
	spec := collectionOf([]*ebpf.ProgramSpec{shapedProgram("pe", ebpf.PerfEvent, 0, 10, 10, 1)})
	spec.Maps["jmp"] = &ebpf.MapSpec{Name: "jmp", Type: ebpf.ProgramArray, KeySize: 4, ValueSize: 4, MaxEntries: 4}
	_, _, err := Collection(spec, &Options{MapReplacements: map[string]*ebpf.Map{"jmp": jmp}})
	if !errors.Is(err, ErrAfterVerification) {
		t.Fatalf("err = %v, want ErrAfterVerification", err)
	}
	var pe *ProgramError
	if !errors.As(err, &pe) || pe.Program != "pe" || !pe.AfterVerification || pe.Rejected {
		t.Fatalf("ProgramError = %+v", pe)
	}
	for _, want := range []string{"accepted the program but the kernel refused it", "processed ", "EINVAL", "jmp", "Kprobe", "PerfEvent"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
}

// BenchmarkShaped loads the two-group object (split) and reports, per
// iteration, the makespan over max(longest, total/CPUs) for the default
// (instruction count) order and for OrderCached with a warm cache, side by
// side, and the failure path against the success path.
func BenchmarkShaped(b *testing.B) {
	probetest.RequireBPF(b)
	spec := shapedSpec()
	warm := NewCostCache("")
	if coll, _, err := Collection(spec, &Options{SplitTailCallMaps: true, Costs: warm}); err != nil {
		b.Fatal(err)
	} else {
		coll.Close()
	}
	run := func(b *testing.B, opts func() *Options, fail bool) {
		var sum profileSum
		var wall time.Duration
		for b.Loop() {
			start := time.Now()
			coll, prof, err := Collection(spec, opts())
			wall += time.Since(start)
			if fail != (err != nil) {
				b.Fatalf("err = %v, want failure %v", err, fail)
			}
			if coll != nil {
				coll.Close()
			}
			sum.add(prof)
		}
		sum.report(b)
		b.ReportMetric(float64(wall.Milliseconds())/float64(sum.n), "wall-ms")
	}
	b.Run("lpt", func(b *testing.B) {
		run(b, func() *Options { return &Options{SplitTailCallMaps: true} }, false)
	})
	b.Run("cached-warm", func(b *testing.B) {
		run(b, func() *Options { return &Options{SplitTailCallMaps: true, Order: OrderCached, Costs: warm} }, false)
	})
	b.Run("cached-cold", func(b *testing.B) {
		run(b, func() *Options { return &Options{SplitTailCallMaps: true, Order: OrderCached, Costs: NewCostCache("")} }, false)
	})
	// One heavy perf_event program refused after verification: the map it
	// tail-calls through is replaced by one a kprobe program owns.
	failSpec := shapedSpec()
	failSpec.Programs["pe_entry09"].Instructions = renameRef(failSpec.Programs["pe_entry09"].Instructions, "jmp", "owned")
	failSpec.Maps["owned"] = &ebpf.MapSpec{Name: "owned", Type: ebpf.ProgramArray, KeySize: 4, ValueSize: 4, MaxEntries: 4}
	owned := kprobeOwned(b)
	// Side by side in each iteration, so that the machine's noise hits
	// both: the failing object, then the good one.
	b.Run("failure-vs-success", func(b *testing.B) {
		var failWall, okWall time.Duration
		n := 0
		for b.Loop() {
			start := time.Now()
			_, _, err := Collection(failSpec, &Options{SplitTailCallMaps: true, MapReplacements: map[string]*ebpf.Map{"owned": owned}})
			failWall += time.Since(start)
			if !errors.Is(err, ErrAfterVerification) {
				b.Fatalf("err = %v, want ErrAfterVerification", err)
			}
			start = time.Now()
			coll, _, err := Collection(spec, &Options{SplitTailCallMaps: true})
			okWall += time.Since(start)
			if err != nil {
				b.Fatal(err)
			}
			coll.Close()
			n++
		}
		b.ReportMetric(float64(failWall.Milliseconds())/float64(n), "fail-ms")
		b.ReportMetric(float64(okWall.Milliseconds())/float64(n), "ok-ms")
		b.ReportMetric(float64(failWall)/float64(okWall), "x-fail/ok")
	})
}

func renameRef(insns asm.Instructions, from, to string) asm.Instructions {
	out := make(asm.Instructions, len(insns))
	copy(out, insns)
	for i := range out {
		if out[i].Reference() == from {
			out[i] = out[i].WithReference(to)
		}
	}
	return out
}
