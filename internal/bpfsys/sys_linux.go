package bpfsys

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// bpf is the bpf(2) system call.
func bpf(cmd int, attr unsafe.Pointer, size uintptr) (uintptr, unix.Errno) {
	r, _, errno := unix.Syscall(unix.SYS_BPF, uintptr(cmd), uintptr(attr), size)
	return r, errno
}

// unlimitMemlock lifts this process's RLIMIT_MEMLOCK to infinity.
func unlimitMemlock() error {
	inf := unix.Rlimit{Cur: unix.RLIM_INFINITY, Max: unix.RLIM_INFINITY}
	return unix.Prlimit(0, unix.RLIMIT_MEMLOCK, &inf, nil)
}
