//go:build !386 && !amd64 && !arm64 && !riscv64 && !s390x && !ppc64le

package main

// bpf2go builds latency.c and count_args.c only for the architectures
// whose pt_regs they know; knownRegisters refuses the commands that need
// them everywhere else, before these are reached. The types mirror the
// generated ones so that the rest of the command builds.

import (
	"fmt"
	"runtime"

	"github.com/cilium/ebpf"
)

type latencyHist struct {
	Slots [40]uint64
	Count uint64
	SumNs uint64
}

type latencySite struct {
	Fn       uint32
	IsReturn uint8
	Go       uint8
	SpGain   uint16
}

func loadLatency() (*ebpf.CollectionSpec, error) { return nil, errNoRegisters }

func loadCountArgs() (*ebpf.CollectionSpec, error) { return nil, errNoRegisters }

var errNoRegisters = fmt.Errorf("no BPF objects that read registers on %s: %w", runtime.GOARCH, ebpf.ErrNotSupported)
