//go:build !386 && !amd64 && !arm64 && !riscv64 && !s390x && !ppc64le

package latency

// bpf2go builds latency.c only for the architectures whose pt_regs it
// knows; New refuses the others with this error. The types mirror the
// generated ones so that the package builds everywhere.

import (
	"fmt"
	"runtime"

	"github.com/cilium/ebpf"
)

type timerByKey struct {
	Key uint32
	Pad uint32
	Who uint64
}

type timerHist struct {
	Slots [40]uint64
	Count uint64
	SumNs uint64
}

type timerSite struct {
	Fn       uint32
	IsReturn uint8
	Go       uint8
	SpGain   uint16
}

func loadTimer() (*ebpf.CollectionSpec, error) {
	return nil, fmt.Errorf("latency: no timer for %s, whose registers it does not know: %w", runtime.GOARCH, ebpf.ErrNotSupported)
}
