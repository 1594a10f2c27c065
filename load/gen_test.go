package load

// The BPF object the tests and the multiprobe load command's tests read; the
// .o files are committed so that the tests need no clang.
//go:generate clang-19 -O2 -g -fdebug-compilation-dir=. -target bpf -I/usr/include/x86_64-linux-gnu -c testdata/multi.c -o testdata/multi.o
//go:generate clang-19 -O2 -g -fdebug-compilation-dir=. -target bpf -I/usr/include/x86_64-linux-gnu -DBROKEN -c testdata/multi.c -o testdata/multi_broken.o

import (
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// sharedMap is the map every generated program reads its unknown value from,
// so that concurrent loads share it.
func sharedMapSpec() *ebpf.MapSpec {
	return &ebpf.MapSpec{Name: "shared", Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1}
}

// lookupShared loads the first value of map "shared" into R9, a scalar the
// verifier knows nothing about; it jumps to "out" if the lookup fails.
func lookupShared() asm.Instructions {
	return asm.Instructions{
		asm.StoreImm(asm.RFP, -4, 0, asm.Word),
		asm.LoadMapPtr(asm.R1, 0).WithReference("shared"),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -4),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "out"),
		asm.LoadMem(asm.R9, asm.R0, 0, asm.Word),
	}
}

// skewedProgram returns a socket filter whose verification cost is about
// iters * (body + 3*diamonds) processed instructions: a bounded loop the
// verifier walks once per iteration (its counter is precise), around
// diamonds branches on the unknown value (each pushes a state to explore)
// and body straight-line instructions. Its static size is only body +
// 3*diamonds + 15, so iters decides how badly the instruction count
// misranks it.
func skewedProgram(name string, iters, body, diamonds int) *ebpf.ProgramSpec {
	insns := lookupShared()
	insns = append(insns,
		asm.Mov.Imm(asm.R7, 0),
		asm.Mov.Imm(asm.R8, 0),
		asm.Add.Reg(asm.R7, asm.R9).WithSymbol("loop"),
	)
	for i := range diamonds {
		skip := fmt.Sprintf("d%d", i)
		insns = append(insns,
			asm.JGT.Imm(asm.R9, int32(i*7+1), skip),
			asm.Add.Imm(asm.R7, 1),
			asm.Xor.Imm(asm.R7, 3).WithSymbol(skip),
		)
	}
	for i := range body {
		insns = append(insns, asm.Xor.Imm(asm.R7, int32(i)))
	}
	insns = append(insns,
		asm.Add.Imm(asm.R8, 1),
		asm.JLT.Imm(asm.R8, int32(iters), "loop"),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("out"),
		asm.Return(),
	)
	return &ebpf.ProgramSpec{Name: name, Type: ebpf.SocketFilter, Instructions: insns, License: "GPL"}
}

// badProgram returns a program the verifier rejects: it exits without
// setting R0. The log is the same on every run (no map ids in it).
func badProgram(name string) *ebpf.ProgramSpec {
	return &ebpf.ProgramSpec{
		Name: name,
		Type: ebpf.SocketFilter,
		Instructions: asm.Instructions{
			asm.Mov.Imm(asm.R1, 0),
			asm.Return(),
		},
		License: "GPL",
	}
}

// btfProgram returns a BTF-enabled raw tracepoint program (tp_btf) for
// sys_enter, whose load looks the tracepoint up in kernel BTF. (fentry would
// do as well but needs CONFIG_FUNCTION_TRACER, which the test VM lacks.)
func btfProgram(name string) *ebpf.ProgramSpec {
	insns := lookupShared()
	insns = append(insns,
		asm.Mov.Imm(asm.R0, 0).WithSymbol("out"),
		asm.Return(),
	)
	return &ebpf.ProgramSpec{
		Name:         name,
		Type:         ebpf.Tracing,
		AttachType:   ebpf.AttachTraceRawTp,
		AttachTo:     "sys_enter",
		Instructions: insns,
		License:      "GPL",
	}
}

// skewedSet is the benchmark's program set: one dominant program, several
// medium ones, many small ones, named so that the given (name) order starts
// the dominant one last. Two small programs are long but cheap and one
// medium program is short but loops long: the instruction count misranks
// them, the cost cache does not.
func skewedSet() []*ebpf.ProgramSpec {
	type p struct{ iters, body, diamonds int }
	set := []p{
		{5, 320, 0}, {5, 300, 0}, // long, cheap
		{40, 20, 1}, {60, 30, 0}, {30, 50, 1}, {50, 40, 0}, {20, 60, 1},
		{80, 25, 0}, {40, 45, 1}, {70, 35, 0}, {25, 55, 1}, {90, 20, 0},
		{45, 40, 1}, {55, 30, 0},
		{3000, 8, 1}, // short, costly
		{400, 60, 2}, {450, 70, 2}, {350, 80, 2}, {500, 60, 2},
		{1200, 120, 4}, // dominant
	}
	specs := make([]*ebpf.ProgramSpec, len(set))
	for i, s := range set {
		specs[i] = skewedProgram(fmt.Sprintf("prog%02d", i), s.iters, s.body, s.diamonds)
	}
	return specs
}

// collectionOf wraps programs and the shared map into a CollectionSpec.
func collectionOf(progs []*ebpf.ProgramSpec) *ebpf.CollectionSpec {
	cs := &ebpf.CollectionSpec{
		Maps:     map[string]*ebpf.MapSpec{"shared": sharedMapSpec()},
		Programs: make(map[string]*ebpf.ProgramSpec, len(progs)),
	}
	for _, p := range progs {
		cs.Programs[p.Name] = p
	}
	return cs
}
