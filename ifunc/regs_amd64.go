//go:build linux

package ifunc

import (
	"encoding/binary"

	"golang.org/x/sys/unix"
)

// breakpoint is int3.
var breakpoint = []byte{0xcc}

// call runs the function at fn in the stopped tracee with hwcap as its
// first argument and returns its result. Its return address is 0: the
// return faults, which stops the tracee for us.
func call(pid int, saved *unix.PtraceRegs, fn, hwcap uint64) (uint64, error) {
	regs := *saved
	// Below the red zone and aligned as at a call: RSP+8 a multiple of 16
	// once the return address is pushed.
	sp := (saved.Rsp-1024)&^15 - 8
	var ret [8]byte
	binary.LittleEndian.PutUint64(ret[:], 0)
	if _, err := unix.PtracePokeData(pid, uintptr(sp), ret[:]); err != nil {
		return 0, err
	}
	regs.Rsp, regs.Rip, regs.Rdi, regs.Rsi, regs.Rax = sp, fn, hwcap, 0, 0
	regs.Orig_rax = ^uint64(0) // not in a system call: nothing to restart
	return run(pid, &regs, func(r *unix.PtraceRegs) (pc, result uint64) { return r.Rip, r.Rax })
}
