//go:build !linux

package testprogs

import (
	"fmt"

	"github.com/cilium/ebpf"
)

// ForeignUprobe needs Linux's perf-event uprobes.
func ForeignUprobe(path string, off, refCtr uint64) (closeFn func(), err error) {
	return nil, fmt.Errorf("testprogs: a uprobe at %s+%#x: %w", path, off, ebpf.ErrNotSupported)
}
