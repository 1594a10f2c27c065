package testprogs

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ForeignUprobe opens a perf-event uprobe at path+off with the
// ref-counter offset refCtr and no BPF program, as another tracer leaves
// one (bcc 0.26 left such probes), and returns what closes it. The kernel
// keeps one uprobe per inode and offset, and refuses a consumer that asks
// for another ref-counter offset there with EINVAL.
func ForeignUprobe(path string, off, refCtr uint64) (closeFn func(), err error) {
	b, err := os.ReadFile("/sys/bus/event_source/devices/uprobe/type")
	if err != nil {
		return nil, err
	}
	typ, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 32)
	if err != nil {
		return nil, err
	}
	p, err := unix.BytePtrFromString(path)
	if err != nil {
		return nil, err
	}
	attr := unix.PerfEventAttr{
		Type:   uint32(typ),
		Size:   uint32(unsafe.Sizeof(unix.PerfEventAttr{})),
		Config: refCtr << 32, // the ref-counter offset's bits (format/ref_ctr_offset)
		Ext1:   uint64(uintptr(unsafe.Pointer(p))),
		Ext2:   off,
	}
	// The uprobe is registered as the event is made, enabled or not.
	fd, err := unix.PerfEventOpen(&attr, -1, 0, -1, unix.PERF_FLAG_FD_CLOEXEC)
	runtime.KeepAlive(p)
	if err != nil {
		return nil, fmt.Errorf("opening a uprobe at %s+%#x with ref-counter offset %#x: %w", path, off, refCtr, err)
	}
	return func() { unix.Close(fd) }, nil
}
