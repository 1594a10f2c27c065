//go:build linux

package ifunc

import (
	"golang.org/x/sys/unix"
)

// breakpoint is BRK #0.
var breakpoint = []byte{0x00, 0x00, 0x20, 0xd4}

// call runs the function at fn in the stopped tracee with hwcap as its
// first argument (glibc's aarch64 resolvers take AT_HWCAP there) and
// returns its result. Its return address, in X30, is 0: the return
// faults, which stops the tracee for us.
func call(pid int, saved *unix.PtraceRegs, fn, hwcap uint64) (uint64, error) {
	regs := *saved
	regs.Sp = (saved.Sp - 1024) &^ 15
	regs.Pc = fn
	regs.Regs[0], regs.Regs[1], regs.Regs[30] = hwcap, 0, 0
	return run(pid, &regs, func(r *unix.PtraceRegs) (pc, result uint64) { return r.Pc, r.Regs[0] })
}
