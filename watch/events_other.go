//go:build !386 && !amd64 && !arm64 && !riscv64 && !s390x && !ppc64le

package watch

// bpf2go builds bpf/events.c only for the architectures whose system call
// registers it knows; elsewhere the events program does not load.

import (
	"fmt"
	"runtime"

	"github.com/cilium/ebpf"
)

func loadEvents() (*ebpf.CollectionSpec, error) {
	return nil, fmt.Errorf("no events program for %s: %w", runtime.GOARCH, ebpf.ErrNotSupported)
}
