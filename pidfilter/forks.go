package pidfilter

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
)

// descendant marks, in a pid's value, a process or thread that joined the
// set as a child of one in it (FollowForks) rather than by Acquire: it
// leaves the set when it exits, unless a holder acquired it meanwhile.
// The reference count is the value's other bits.
const descendant = 1 << 31

// descendantImm is descendant as an instruction's 32-bit immediate.
const descendantImm = -1 << 31

// Forks is a Filter following forks: see FollowForks.
type Forks struct {
	progs []*ebpf.Program
	links []link.Link
}

// FollowForks makes the set grow with the processes that those in it
// make: a child (a process, or a thread) made by one in the set joins it
// before it first runs, from a raw tracepoint program on
// sched_process_fork, and leaves it when it exits (sched_process_exit),
// unless a holder acquired it meanwhile. So a command's descendants count
// with it: a shell's, timeout's, a pipeline's, what a shim runs. A child
// made while the set is full (see NewFilter) is not added. Close the
// Forks to stop following; the children added stay until they exit or
// the maps are closed.
//
// The programs read the child's pid from its task_struct, at the offset
// the kernel's BTF gives (Linux 5.2+ with BTF; a kernel without is an
// error wrapping ebpf.ErrNotSupported).
func (f *Filter) FollowForks() (_ *Forks, err error) {
	pidOff, err := taskPIDOffset()
	if err != nil {
		return nil, fmt.Errorf("pidfilter: following forks: %w", err)
	}
	fk := &Forks{}
	defer func() {
		if err != nil {
			fk.Close()
		}
	}()
	for _, p := range []struct {
		name  string
		insns asm.Instructions
	}{
		{"sched_process_fork", forkInsns(f.m, pidOff)},
		{"sched_process_exit", exitInsns(f.m)},
	} {
		prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "mp_" + p.name[6:], Type: ebpf.RawTracepoint, License: "GPL", Instructions: p.insns})
		if err != nil {
			return nil, fmt.Errorf("pidfilter: loading the %s program: %w", p.name, err)
		}
		fk.progs = append(fk.progs, prog)
		l, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: p.name, Program: prog})
		if err != nil {
			return nil, fmt.Errorf("pidfilter: attaching to %s: %w", p.name, err)
		}
		fk.links = append(fk.links, l)
	}
	return fk, nil
}

// Close stops following forks.
func (fk *Forks) Close() error {
	var errs []error
	for _, l := range fk.links {
		errs = append(errs, l.Close())
	}
	for _, p := range fk.progs {
		errs = append(errs, p.Close())
	}
	fk.links, fk.progs = nil, nil
	return errors.Join(errs...)
}

// taskPIDOffset is the offset of the pid (the thread's id) in the
// kernel's struct task_struct.
func taskPIDOffset() (int32, error) {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return 0, fmt.Errorf("reading the kernel's BTF: %w", err)
	}
	var task *btf.Struct
	if err := spec.TypeByName("task_struct", &task); err != nil {
		return 0, fmt.Errorf("struct task_struct in the kernel's BTF: %w", err)
	}
	for _, m := range task.Members {
		if m.Name == "pid" {
			return int32(m.Offset.Bytes()), nil
		}
	}
	return 0, errors.New("struct task_struct has no pid in the kernel's BTF")
}

// forkInsns is the sched_process_fork program: if the current process
// (the parent) is in the set, held or a descendant, its child joins it,
// marked descendant. The raw tracepoint's arguments are the parent's and
// the child's task_struct.
func forkInsns(pids *ebpf.Map, pidOff int32) asm.Instructions {
	return asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1), // the arguments
		asm.FnGetCurrentPidTgid.Call(),
		asm.RSh.Imm(asm.R0, 32), // the tgid
		asm.StoreMem(asm.RFP, -4, asm.R0, asm.Word),
		asm.LoadMapPtr(asm.R1, pids.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -4),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "out"),
		// A parent held by nobody, kept only while every process is
		// let through (see Filter.purge), makes no member.
		asm.LoadMem(asm.R1, asm.R0, 0, asm.Word),
		asm.JEq.Imm(asm.R1, 0, "out"),
		// The child's pid: args[1]->pid.
		asm.LoadMem(asm.R3, asm.R6, 8, asm.DWord),
		asm.Add.Imm(asm.R3, pidOff),
		asm.Mov.Reg(asm.R1, asm.RFP),
		asm.Add.Imm(asm.R1, -8),
		asm.Mov.Imm(asm.R2, 4),
		asm.FnProbeReadKernel.Call(),
		asm.JNE.Imm(asm.R0, 0, "out"),
		asm.StoreImm(asm.RFP, -12, descendantImm, asm.Word),
		asm.LoadMapPtr(asm.R1, pids.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -8),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, -12),
		asm.Mov.Imm(asm.R4, int32(ebpf.UpdateNoExist)),
		asm.FnMapUpdateElem.Call(),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("out"),
		asm.Return(),
	}
}

// exitInsns is the sched_process_exit program: the exiting thread leaves
// the set if it joined as a descendant and no holder acquired it since.
func exitInsns(pids *ebpf.Map) asm.Instructions {
	return asm.Instructions{
		asm.FnGetCurrentPidTgid.Call(),
		asm.StoreMem(asm.RFP, -4, asm.R0, asm.Word), // the thread's id, the low half
		asm.LoadMapPtr(asm.R1, pids.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -4),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "out"),
		asm.LoadMem(asm.R1, asm.R0, 0, asm.Word),
		asm.JNE.Imm32(asm.R1, descendantImm, "out"),
		asm.LoadMapPtr(asm.R1, pids.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -4),
		asm.FnMapDeleteElem.Call(),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("out"),
		asm.Return(),
	}
}
