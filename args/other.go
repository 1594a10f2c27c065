//go:build !386 && !amd64 && !arm64 && !riscv64 && !s390x && !ppc64le

package args

// bpf2go builds args.c only for the architectures whose calling
// conventions it knows; New refuses the others with this error.

import (
	"fmt"
	"runtime"

	"github.com/cilium/ebpf"
)

func loadTracer() (*ebpf.CollectionSpec, error) {
	return nil, fmt.Errorf("args: no tracer for %s, whose registers it does not know: %w", runtime.GOARCH, ebpf.ErrNotSupported)
}
