//go:build !linux

package bpfsys

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// bpf fails with ENOSYS: there is no bpf(2) outside Linux.
func bpf(cmd int, attr unsafe.Pointer, size uintptr) (uintptr, unix.Errno) {
	return 0, unix.ENOSYS
}

// unlimitMemlock has nothing to do: no BPF memory is charged outside Linux.
func unlimitMemlock() error { return nil }
