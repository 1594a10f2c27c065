package ifunc

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// run sets the tracee's registers, lets it run until it faults returning
// to address 0, and reads the result.
func run(pid int, regs *unix.PtraceRegs, read func(*unix.PtraceRegs) (pc, result uint64)) (uint64, error) {
	if err := unix.PtraceSetRegs(pid, regs); err != nil {
		return 0, err
	}
	if err := unix.PtraceCont(pid, 0); err != nil {
		return 0, err
	}
	if err := waitStop(pid, unix.SIGSEGV); err != nil {
		return 0, err
	}
	var got unix.PtraceRegs
	if err := unix.PtraceGetRegs(pid, &got); err != nil {
		return 0, err
	}
	pc, result := read(&got)
	if pc != 0 {
		return 0, fmt.Errorf("faulted at %#x, not on returning", pc)
	}
	return result, nil
}
