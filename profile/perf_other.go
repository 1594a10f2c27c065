//go:build !linux

package profile

import (
	"fmt"
	"runtime"

	"github.com/cilium/ebpf"
)

// errNotLinux: perf events are Linux's.
var errNotLinux = fmt.Errorf("profile: perf events on %s: %w", runtime.GOOS, ebpf.ErrNotSupported)

// ring stands for a CPU's sampling ring, which only Linux has.
type ring struct{}

func openRing(cpu, freq int) (*ring, error) { return nil, errNotLinux }

func (r *ring) read(sample func(ip uint64, chain []uint64), lost func(n uint64)) {}

func (r *ring) close() error { return nil }

func (r *ring) enable() error { return errNotLinux }

func (r *ring) disable() error { return nil }

func (m *Meter) openCounters() error { return errNotLinux }
