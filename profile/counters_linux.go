package profile

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// openCounters opens a cycle and an instruction counter on every CPU and
// hands them to the meter's perf event arrays. A counter the PMU lacks
// (ENOENT, EOPNOTSUPP, ENODEV: a VM without one) is left out; the BPF side
// then reads an error on that CPU and counts nothing.
func (m *Meter) openCounters() error {
	for _, c := range []struct {
		config uint64
		array  *ebpf.Map
	}{{unix.PERF_COUNT_HW_CPU_CYCLES, m.objs.Cycles}, {unix.PERF_COUNT_HW_INSTRUCTIONS, m.objs.Insns}} {
		for cpu := 0; cpu < int(m.objs.Cycles.MaxEntries()); cpu++ {
			attr := unix.PerfEventAttr{Type: unix.PERF_TYPE_HARDWARE, Config: c.config}
			attr.Size = uint32(unsafe.Sizeof(attr))
			fd, err := unix.PerfEventOpen(&attr, -1, cpu, -1, unix.PERF_FLAG_FD_CLOEXEC)
			if err != nil {
				if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENODEV) || errors.Is(err, unix.EINVAL) {
					continue
				}
				return fmt.Errorf("profile: opening a hardware counter on CPU %d: %w", cpu, err)
			}
			m.events = append(m.events, fd)
			if err := c.array.Put(uint32(cpu), uint32(fd)); err != nil {
				return fmt.Errorf("profile: counter of CPU %d: %w", cpu, err)
			}
		}
	}
	return nil
}
