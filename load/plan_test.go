package load

import (
	"errors"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// An unused PROG_ARRAY used to panic the planning (group[1:] of nothing).
func TestPlanUnusedProgArray(t *testing.T) {
	spec := collectionOf(smallSet(1))
	spec.Maps["jmp"] = &ebpf.MapSpec{Name: "jmp", Type: ebpf.ProgramArray, KeySize: 4, ValueSize: 4, MaxEntries: 1}
	for _, at := range []bool{false, true} {
		p, err := planCollection(spec, &Options{}, at)
		if err != nil || len(p.jobs) != 1 || len(p.order) != 1 {
			t.Fatalf("plan: %v", err)
		}
	}
}

// kindSpec has a kprobe and a perf_event program calling through one map.
func kindSpec() *ebpf.CollectionSpec {
	prog := func(name string, typ ebpf.ProgramType) *ebpf.ProgramSpec {
		return &ebpf.ProgramSpec{Name: name, Type: typ, License: "GPL", Instructions: asm.Instructions{
			asm.LoadMapPtr(asm.R2, 0).WithReference("jmp"),
			asm.Mov.Imm(asm.R3, 0),
			asm.FnTailCall.Call(),
			asm.Mov.Imm(asm.R0, 0),
			asm.Return(),
		}}
	}
	return &ebpf.CollectionSpec{
		Maps: map[string]*ebpf.MapSpec{"jmp": {Name: "jmp", Type: ebpf.ProgramArray, KeySize: 4, ValueSize: 4, MaxEntries: 1}},
		Programs: map[string]*ebpf.ProgramSpec{
			"a_kp": prog("a_kp", ebpf.Kprobe),
			"b_pe": prog("b_pe", ebpf.PerfEvent),
		},
	}
}

func TestPlanProgramTypeMix(t *testing.T) {
	_, err := planCollection(kindSpec(), &Options{}, false)
	var mix *TailCallMixError
	if !errors.As(err, &mix) || !errors.Is(err, ErrTailCallMix) {
		t.Fatalf("err %v, want a TailCallMixError", err)
	}
	for _, want := range []string{"jmp", "a_kp", "b_pe", "Kprobe", "PerfEvent", "SplitTailCallMaps"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	p, err := planCollection(kindSpec(), &Options{SplitTailCallMaps: true}, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.copies) != 2 || p.copies[0].Copy != "jmp" || p.copies[1].Copy != "jmp_perfevent" || p.maps["jmp_perfevent"] == nil {
		t.Fatalf("copies %+v", p.copies)
	}
	if p.jobs[1].rename["jmp"] != "jmp_perfevent" || p.jobs[0].rename != nil {
		t.Errorf("renames %v %v", p.jobs[0].rename, p.jobs[1].rename)
	}
}
