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

// FuzzPlan decodes bytes into programs × maps × references (unused maps,
// empty sets, contents naming programs or nothing) and checks that the
// planning never panics, orders every job once, and is deterministic.
func FuzzPlan(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{1, 1, 0, 0})          // one program, one unused prog array
	f.Add([]byte{2, 1, 0, 1, 1, 2, 3}) // two kinds on one map
	f.Fuzz(func(t *testing.T, data []byte) {
		next := func() int {
			if len(data) == 0 {
				return 0
			}
			b := data[0]
			data = data[1:]
			return int(b)
		}
		nprog, nmap := next()%8, next()%4
		types := []ebpf.ProgramType{ebpf.Kprobe, ebpf.PerfEvent, ebpf.SocketFilter, ebpf.UnspecifiedProgram}
		spec := &ebpf.CollectionSpec{Maps: map[string]*ebpf.MapSpec{}, Programs: map[string]*ebpf.ProgramSpec{}}
		for i := range nmap {
			ms := &ebpf.MapSpec{Name: "m" + string(rune('a'+i)), Type: ebpf.Array}
			if next()%2 == 0 {
				ms.Type = ebpf.ProgramArray
			}
			for range next() % 3 {
				ms.Contents = append(ms.Contents, ebpf.MapKV{Key: uint32(0), Value: "p" + string(rune('a'+next()%9))})
			}
			spec.Maps[ms.Name] = ms
		}
		for i := range nprog {
			ps := &ebpf.ProgramSpec{Name: "p" + string(rune('a'+i)), Type: types[next()%len(types)], AttachType: ebpf.AttachType(next() % 2 * int(ebpf.AttachTraceUprobeMulti))}
			for range next() % 3 {
				if nmap > 0 {
					ps.Instructions = append(ps.Instructions, asm.LoadMapPtr(asm.R1, 0).WithReference("m"+string(rune('a'+next()%nmap))))
				}
			}
			ps.Instructions = append(ps.Instructions, asm.Return())
			spec.Programs[ps.Name] = ps
		}
		for _, split := range []bool{false, true} {
			for _, at := range []bool{false, true} {
				o := &Options{SplitTailCallMaps: split}
				p, err := planCollection(spec, o, at)
				q, err2 := planCollection(spec, o, at)
				if (err == nil) != (err2 == nil) || err != nil && err.Error() != err2.Error() {
					t.Fatalf("not deterministic: %v / %v", err, err2)
				}
				if err != nil {
					if !errors.Is(err, ErrTailCallMix) {
						t.Fatalf("unexpected error %v", err)
					}
					continue
				}
				seen := map[*job]bool{}
				for _, j := range p.order {
					seen[j] = true
				}
				if len(seen) != len(p.jobs) || len(p.order) != len(q.order) {
					t.Fatalf("order is not a permutation of the jobs")
				}
				for _, j := range p.jobs {
					for _, r := range j.rename {
						if p.maps[r] == nil {
							t.Fatalf("%s renamed to missing map %s", j.name, r)
						}
					}
				}
			}
		}
	})
}
