package pidfilter_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/multiprobe/multiprobe/pidfilter"
	"github.com/multiprobe/multiprobe/probetest"
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
	const pro = 20 // prologue and "r1 = r6"
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
	if m := cs.Maps[pidfilter.AllMapName]; m == nil || m.Type != ebpf.Array || m.MaxEntries != 1 {
		t.Errorf("map %s = %+v", pidfilter.AllMapName, m)
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
	badAll := spec()
	badAll.Maps[pidfilter.AllMapName] = &ebpf.MapSpec{Name: pidfilter.AllMapName, Type: ebpf.Hash, KeySize: 4, ValueSize: 4, MaxEntries: 1}
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
		{"bad all map", badAll, nil, pidfilter.ErrBadMap},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := pidfilter.Inject(tc.cs, tc.progs...); !errors.Is(err, tc.want) {
				t.Errorf("Inject: %v, want %v", err, tc.want)
			}
		})
	}
}

// TestFilterRefcounts changes a pid set through two holders of one map
// and reads it back after each step.
func TestFilterRefcounts(t *testing.T) {
	probetest.RequireBPF(t)
	f, err := pidfilter.NewFilter(5)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g, err := pidfilter.New(f.Map(), f.AllMap()) // a second holder of the same maps
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	check := func(step string, want ...int) {
		t.Helper()
		got, err := f.PIDs()
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("%s: PIDs() = %v, %v; want %v", step, got, err, want)
		}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(f.Acquire(3, 1))
	must(g.Acquire(1, 2))
	check("two holders", 1, 2, 3)
	if n, err := f.Count(1); n != 2 || err != nil {
		t.Errorf("Count(1) = %d, %v; want 2", n, err)
	}
	must(g.Release(1, 2))
	check("second released", 1, 3)
	if err := g.Release(2); !errors.Is(err, pidfilter.ErrNotHeld) {
		t.Errorf("Release of a pid not held: %v, want ErrNotHeld", err)
	}
	must(f.Replace([]int{3, 1}, []int{3, pidfilter.AllPIDs}))
	check("replaced", pidfilter.AllPIDs, 3)
	if n, _ := f.Count(3); n != 1 {
		t.Errorf("after Replace keeping 3: Count(3) = %d, want 1", n)
	}
	if err := f.Replace([]int{99}, []int{4}); !errors.Is(err, pidfilter.ErrNotHeld) {
		t.Errorf("Replace of a pid not held: %v, want ErrNotHeld", err)
	}
	check("failed Replace changes nothing", pidfilter.AllPIDs, 3)
	for _, bad := range []int{-1, int(^uint(0) >> 1)} { // negative, and past any pid (int64 on 64-bit hosts)
		if err := f.Acquire(bad); !errors.Is(err, pidfilter.ErrBadPID) {
			t.Errorf("Acquire(%d): %v, want ErrBadPID", bad, err)
		}
		if err := f.Release(bad); !errors.Is(err, pidfilter.ErrBadPID) {
			t.Errorf("Release(%d): %v, want ErrBadPID", bad, err)
		}
	}
	if err := f.Acquire(5, 6, 7, 8, 9); err == nil {
		t.Error("Acquire past the map's capacity: no error")
	}
	check("failed Acquire changes nothing", pidfilter.AllPIDs, 3)
	arr, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer arr.Close()
	if _, err := pidfilter.New(arr, f.AllMap()); !errors.Is(err, pidfilter.ErrBadMap) {
		t.Errorf("New(array, ...): %v, want ErrBadMap", err)
	}
	if _, err := pidfilter.New(f.Map(), f.Map()); !errors.Is(err, pidfilter.ErrBadMap) {
		t.Errorf("New(hash, hash): %v, want ErrBadMap", err)
	}
	var all uint32
	if err := f.AllMap().Lookup(uint32(0), &all); err != nil || all != 1 {
		t.Errorf("%s[0] = %d, %v; want 1 holder of AllPIDs", pidfilter.AllMapName, all, err)
	}
	// Pid 1, released while every process is let through, stays in the
	// map held by nobody until that ends, so that a run of the filter
	// between two changes finds it (see Filter.purge).
	var v uint32
	if err := f.Map().Lookup(uint32(1), &v); err != nil || v != 0 {
		t.Errorf("pid 1 released under AllPIDs: %s[1] = %d, %v; want 0, kept", pidfilter.MapName, v, err)
	}
	must(f.Replace([]int{pidfilter.AllPIDs}, []int{1}))
	check("back to a set", 1, 3)
	must(f.Replace([]int{1}, []int{pidfilter.AllPIDs}))
	must(f.Release(3))
	check("every process, nobody held", pidfilter.AllPIDs)
	must(f.Release(pidfilter.AllPIDs))
	check("empty", []int(nil)...)
	if err := f.Map().Lookup(uint32(1), &v); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Errorf("after AllPIDs was released: %s[1] = %d, %v; want it removed", pidfilter.MapName, v, err)
	}
	if err := f.Release(1); !errors.Is(err, pidfilter.ErrNotHeld) {
		t.Errorf("Release of a pid kept for nobody: %v, want ErrNotHeld", err)
	}
}

// TestHeaderMaps checks bpf/mp_pids.bpf.h, as testdata/filtered.c includes
// it, against MapSpec and AllMapSpec.
func TestHeaderMaps(t *testing.T) {
	cs, err := loadFiltered()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []*ebpf.MapSpec{pidfilter.MapSpec(pidfilter.DefaultMaxPIDs), pidfilter.AllMapSpec()} {
		got := cs.Maps[want.Name]
		if got == nil {
			t.Fatalf("the header declares no map %s", want.Name)
		}
		if got.Type != want.Type || got.KeySize != want.KeySize || got.ValueSize != want.ValueSize || got.MaxEntries != want.MaxEntries {
			t.Errorf("header's %s is %v %d/%d/%d, Go's %v %d/%d/%d", want.Name,
				got.Type, got.KeySize, got.ValueSize, got.MaxEntries, want.Type, want.KeySize, want.ValueSize, want.MaxEntries)
		}
	}
}
