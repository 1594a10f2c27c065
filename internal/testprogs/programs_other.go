//go:build !386 && !amd64 && !arm64 && !riscv64 && !s390x && !ppc64le

package testprogs

// bpf2go builds counter.c and session.c only for the architectures whose
// pt_regs they know. Elsewhere the package builds (cmd/vmrun imports it)
// and loading them fails with ebpf.ErrNotSupported.

import (
	"fmt"
	"runtime"

	"github.com/cilium/ebpf"
)

var errNoObjects = fmt.Errorf("testprogs: no counter objects for %s: %w", runtime.GOARCH, ebpf.ErrNotSupported)

type counterObjects struct {
	CountEntry, RecordReturn                                     *ebpf.Program
	Counts, LastPid, RetCounts, RetValues, PidCounts, OutOfRange *ebpf.Map
}

func (*counterObjects) Close() error { return nil }

func loadCounter() (*ebpf.CollectionSpec, error) { return nil, errNoObjects }

type sessionObjects struct {
	CountSession                                  *ebpf.Program
	SessionEntries, SessionReturns, SessionValues *ebpf.Map
}

func (*sessionObjects) Close() error { return nil }

func loadSessionObjects(any, *ebpf.CollectionOptions) error { return errNoObjects }
