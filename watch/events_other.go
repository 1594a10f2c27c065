//go:build !386 && !amd64 && !arm64 && !riscv64 && !s390x && !ppc64le

package watch

// bpf2go builds bpf/events.c only for the architectures whose system call
// registers it knows; elsewhere the events program does not load.

import (
	"fmt"
	"runtime"

	"github.com/cilium/ebpf"
)

type eventsObjects struct {
	SysEnter, SysExit, ProcessExec, ProcessExit *ebpf.Program
	Events, Lost                                *ebpf.Map
}

func (o *eventsObjects) Close() error { return nil }

func loadEventsObjects(any, *ebpf.CollectionOptions) error {
	return fmt.Errorf("no events program for %s: %w", runtime.GOARCH, ebpf.ErrNotSupported)
}
