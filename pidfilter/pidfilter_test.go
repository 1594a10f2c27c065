package pidfilter_test

import (
	"errors"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/pidfilter"
)

type line string

func (l line) String() string { return string(l) }

// spec returns a collection whose program "prog" calls the function "sub".
func spec() *ebpf.CollectionSpec {
	fn := &btf.Func{Name: "prog", Linkage: btf.GlobalFunc}
	first := btf.WithFuncMetadata(asm.Mov.Imm(asm.R0, 0).WithSymbol("prog").WithSource(line("int prog(void *ctx)")), fn)
	return &ebpf.CollectionSpec{
		Maps: map[string]*ebpf.MapSpec{},
		Programs: map[string]*ebpf.ProgramSpec{
			"prog": {Name: "prog", Type: ebpf.Kprobe, License: "GPL", Instructions: asm.Instructions{
				first,
				asm.Call.Label("sub"),
				asm.Return(),
				asm.Mov.Imm(asm.R0, 1).WithSymbol("sub"),
				asm.Return(),
			}},
			"sock": {Name: "sock", Type: ebpf.SocketFilter, License: "GPL", Instructions: asm.Instructions{
				asm.Mov.Imm(asm.R0, 0).WithSymbol("sock"), asm.Return(),
			}},
		},
	}
}

func TestInject(t *testing.T) {
	cs := spec()
	orig := cs.Programs["prog"].Instructions
	if err := pidfilter.Inject(cs); err != nil {
		t.Fatal(err)
	}
	insns := cs.Programs["prog"].Instructions
	const pro = 12 // prologue and "r1 = r6"
	if len(insns) != len(orig)+pro {
		t.Fatalf("%d instructions after Inject, want %d:\n%v", len(insns), len(orig)+pro, insns)
	}
	if insns[0].Symbol() != "prog" || insns[pro].Symbol() != "" {
		t.Errorf("symbols %q and %q, want the entry's on the first instruction only", insns[0].Symbol(), insns[pro].Symbol())
	}
	if btf.FuncMetadata(&insns[0]) == nil || btf.FuncMetadata(&insns[pro]) != nil {
		t.Error("BTF func info not moved to the first instruction")
	}
	if insns[0].Source() == nil || insns[0].Source().String() != "int prog(void *ctx)" {
		t.Errorf("first instruction's line info %v, want the entry's", insns[0].Source())
	}
	if mov := insns[pro-1]; mov.OpCode != asm.Mov.Op(asm.RegSource) || mov.Dst != asm.R1 || mov.Src != asm.R6 {
		t.Errorf("instruction %d is %v, want r1 = r6", pro-1, mov)
	}
	if insns[len(insns)-2].Symbol() != "sub" {
		t.Error("subprogram symbol lost")
	}
	if m := cs.Maps[pidfilter.MapName]; m == nil || m.MaxEntries != pidfilter.DefaultMaxPIDs {
		t.Errorf("map %s = %+v", pidfilter.MapName, m)
	}
	if sock := cs.Programs["sock"]; len(sock.Instructions) != 2 {
		t.Error("Inject without names changed a socket filter")
	}

	// Idempotent.
	if err := pidfilter.Inject(cs, "prog"); err != nil {
		t.Fatal(err)
	}
	if n := len(cs.Programs["prog"].Instructions); n != len(insns) {
		t.Errorf("second Inject: %d instructions, want %d", n, len(insns))
	}
}

func TestInjectErrors(t *testing.T) {
	bad := spec()
	bad.Maps[pidfilter.MapName] = &ebpf.MapSpec{Name: pidfilter.MapName, Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1}
	for _, tc := range []struct {
		name  string
		cs    *ebpf.CollectionSpec
		progs []string
		want  error
	}{
		{"nil", nil, nil, pidfilter.ErrNoProgram},
		{"unknown program", spec(), []string{"nope"}, pidfilter.ErrNoProgram},
		{"socket filter", spec(), []string{"sock"}, pidfilter.ErrNoProgram},
		{"bad map", bad, nil, pidfilter.ErrBadMap},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := pidfilter.Inject(tc.cs, tc.progs...); !errors.Is(err, tc.want) {
				t.Errorf("Inject: %v, want %v", err, tc.want)
			}
		})
	}
}

// TestFilterSet changes a pid set through Filter and reads it back.
func TestFilterSet(t *testing.T) {
	testutil.RequireBPF(t)
	m, err := ebpf.NewMap(pidfilter.MapSpec(4))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	f, err := pidfilter.New(m)
	if err != nil {
		t.Fatal(err)
	}
	check := func(want ...int) {
		t.Helper()
		got, err := f.PIDs()
		if err != nil || len(got) != len(want) {
			t.Fatalf("PIDs() = %v, %v; want %v", got, err, want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("PIDs() = %v, want %v", got, want)
			}
		}
	}
	if err := f.Add(3, 1, 2); err != nil {
		t.Fatal(err)
	}
	check(1, 2, 3)
	if err := f.Remove(2, 99); err != nil {
		t.Fatal(err)
	}
	check(1, 3)
	if err := f.Set(3, 4, 5); err != nil {
		t.Fatal(err)
	}
	check(3, 4, 5)
	for _, bad := range []int{0, -1, 1 << 40} {
		if err := f.Add(bad); !errors.Is(err, pidfilter.ErrBadPID) {
			t.Errorf("Add(%d): %v, want ErrBadPID", bad, err)
		}
		if err := f.Set(bad); !errors.Is(err, pidfilter.ErrBadPID) {
			t.Errorf("Set(%d): %v, want ErrBadPID", bad, err)
		}
	}
	check(3, 4, 5)
	if err := f.Add(6, 7); err == nil {
		t.Error("Add past the map's capacity: no error")
	}
	arr, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 1, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer arr.Close()
	if _, err := pidfilter.New(arr); !errors.Is(err, pidfilter.ErrBadMap) {
		t.Errorf("New(array): %v, want ErrBadMap", err)
	}
}
