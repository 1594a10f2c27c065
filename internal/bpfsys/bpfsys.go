package bpfsys

import (
	"runtime"
	"unsafe"

	"github.com/cilium/ebpf/link"
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

// iterAttr is the iterator variant of bpf_attr.link_create.
type iterAttr struct {
	progFD, targetFD, attachType, flags uint32
	iterInfo                            uint64
	iterInfoLen                         uint32
	_                                   uint32
}

// attachTraceIter is BPF_TRACE_ITER.
const attachTraceIter = 28

// LinkCreateIterTask creates a link of the task iterator progFD (task,
// task_file, task_vma) over the threads of process pid, and returns its fd
// or the kernel's errno. Kernels before 6.1 know no such limit: their
// union bpf_iter_link_info is the map's alone, and they refuse the longer
// one with E2BIG rather than walk every task.
func LinkCreateIterTask(progFD int, pid uint32) (int, unix.Errno) {
	// union bpf_iter_link_info (16 bytes, the cgroup member's size); its
	// task member is { tid, pid, pid_fd }.
	var info [4]uint32
	info[1] = pid
	attr := iterAttr{
		progFD:      uint32(progFD),
		attachType:  attachTraceIter,
		iterInfo:    uint64(uintptr(unsafe.Pointer(&info[0]))),
		iterInfoLen: uint32(unsafe.Sizeof(info)),
	}
	fd, errno := bpf(cmdLinkCreate, unsafe.Pointer(&attr), unsafe.Sizeof(attr))
	runtime.KeepAlive(&info)
	if errno != 0 {
		return -1, errno
	}
	return int(fd), 0
}

// linkInfo is the head of the kernel's struct bpf_link_info, which is all
// that LinkID asks for.
type linkInfo struct {
	typ, id, progID uint32
	_               uint32
}

type objInfoAttr struct {
	fd      uint32
	infoLen uint32
	info    uint64
}

// LinkID returns the kernel ID of the link fd.
func LinkID(fd int) (link.ID, unix.Errno) {
	var info linkInfo
	attr := objInfoAttr{fd: uint32(fd), infoLen: uint32(unsafe.Sizeof(info)), info: uint64(uintptr(unsafe.Pointer(&info)))}
	_, errno := bpf(cmdObjGetInfoByFD, unsafe.Pointer(&attr), unsafe.Sizeof(attr))
	runtime.KeepAlive(&info)
	return link.ID(info.id), errno
}

func ptr[T any](s []T) uint64 {
	if len(s) == 0 {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(&s[0])))
}
