//go:build !386 && !amd64 && !arm64 && !riscv64 && !s390x && !ppc64le

package main

// bpf2go builds count_args.c only for the architectures whose pt_regs it
// knows; knownRegisters refuses the commands that need them everywhere
// else, before this is reached.

import (
	"fmt"
	"runtime"

	"github.com/cilium/ebpf"
)

func loadCountArgs() (*ebpf.CollectionSpec, error) { return nil, errNoRegisters }

var errNoRegisters = fmt.Errorf("no BPF objects that read registers on %s: %w", runtime.GOARCH, ebpf.ErrNotSupported)
