package bpfsys

import (
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The bpf(2) commands used here (include/uapi/linux/bpf.h), as numbers so
// that the package builds where golang.org/x/sys/unix has no BPF names.
const (
	cmdObjGetInfoByFD = 15
	cmdLinkCreate     = 28
)

// Flags and values of the same header, for the same reason.
const (
	// FlagUprobeMultiReturn is BPF_F_UPROBE_MULTI_RETURN: the link's
	// probes are return probes.
	FlagUprobeMultiReturn = 1
	// StatsRunTime is BPF_STATS_RUN_TIME, for ebpf.EnableStats.
	StatsRunTime = 0
)

// uprobeMultiAttr is the uprobe_multi variant of the kernel's
// bpf_attr.link_create (include/uapi/linux/bpf.h).
type uprobeMultiAttr struct {
	progFD        uint32
	targetFD      uint32
	attachType    uint32
	flags         uint32
	path          uint64
	offsets       uint64
	refCtrOffsets uint64
	cookies       uint64
	count         uint32
	multiFlags    uint32
	pid           uint32
	_             uint32
}

// UprobeMulti describes one uprobe_multi (or session) link.
type UprobeMulti struct {
	ProgFD     int
	AttachType uint32
	Path       string
	// Offsets, RefCtrOffsets (nil or one per offset) and Cookies (nil or
	// one per offset) are the sites.
	Offsets, RefCtrOffsets, Cookies []uint64
	// Flags are the uprobe_multi flags (BPF_F_UPROBE_MULTI_RETURN).
	Flags uint32
	PID   uint32
}

// LinkCreateUprobeMulti creates the link and returns its fd, or the kernel's
// errno. A path containing NUL is EINVAL.
func LinkCreateUprobeMulti(l UprobeMulti) (int, unix.Errno) {
	path, err := unix.BytePtrFromString(l.Path)
	if err != nil {
		return -1, unix.EINVAL
	}
	attr := uprobeMultiAttr{
		progFD:        uint32(l.ProgFD),
		attachType:    l.AttachType,
		path:          uint64(uintptr(unsafe.Pointer(path))),
		offsets:       ptr(l.Offsets),
		refCtrOffsets: ptr(l.RefCtrOffsets),
		cookies:       ptr(l.Cookies),
		count:         uint32(len(l.Offsets)),
		multiFlags:    l.Flags,
		pid:           l.PID,
	}
	fd, errno := bpf(cmdLinkCreate, unsafe.Pointer(&attr), unsafe.Sizeof(attr))
	runtime.KeepAlive(path)
	runtime.KeepAlive(l.Offsets)
	runtime.KeepAlive(l.RefCtrOffsets)
	runtime.KeepAlive(l.Cookies)
	if errno != 0 {
		return -1, errno
	}
	return int(fd), 0
}

// UprobeMultiInfo is the kernel's struct bpf_link_info with its uprobe_multi
// member. (As of Linux 6.18 it has no missed-events count, unlike
// kprobe_multi's.)
type UprobeMultiInfo struct {
	Type          uint32
	ID            uint32
	ProgID        uint32
	_             uint32
	Path          uint64
	Offsets       uint64
	RefCtrOffsets uint64
	Cookies       uint64
	PathSize      uint32
	Count         uint32
	Flags         uint32
	PID           uint32
}

type objInfoAttr struct {
	fd      uint32
	infoLen uint32
	info    uint64
}

// ObjInfo fills info for the link fd. Set info's pointer and size fields to
// Go memory (with Ptr) to receive the arrays; the caller keeps it alive.
func ObjInfo(fd int, info *UprobeMultiInfo) unix.Errno {
	attr := objInfoAttr{fd: uint32(fd), infoLen: uint32(unsafe.Sizeof(*info)), info: uint64(uintptr(unsafe.Pointer(info)))}
	_, errno := bpf(cmdObjGetInfoByFD, unsafe.Pointer(&attr), unsafe.Sizeof(attr))
	runtime.KeepAlive(info)
	return errno
}

// Ptr returns the address of s's first element for the kernel, or 0 for an
// empty slice.
func Ptr[T any](s []T) uint64 { return ptr(s) }

func ptr[T any](s []T) uint64 {
	if len(s) == 0 {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(&s[0])))
}
