package attach

import (
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// linkCreateAttr is the uprobe_multi variant of the kernel's
// bpf_attr.link_create. cilium/ebpf's public API cannot create session
// links (BPF_TRACE_UPROBE_SESSION) and rewrites errnos, so the link is
// created here. The pointer fields hold addresses of heap memory that the
// caller keeps alive across the call.
type linkCreateAttr struct {
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

func linkCreate(attr *linkCreateAttr) (int, unix.Errno) {
	fd, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_LINK_CREATE, uintptr(unsafe.Pointer(attr)), unsafe.Sizeof(*attr))
	if errno != 0 {
		return -1, errno
	}
	return int(fd), 0
}

// linkInfo is the kernel's struct bpf_link_info with its uprobe_multi
// member. (As of Linux 6.18 it has no missed-events count, unlike
// kprobe_multi's.)
type linkInfo struct {
	typ           uint32
	id            uint32
	progID        uint32
	_             uint32
	path          uint64
	offsets       uint64
	refCtrOffsets uint64
	cookies       uint64
	pathSize      uint32
	count         uint32
	flags         uint32
	pid           uint32
}

type objInfoAttr struct {
	fd      uint32
	infoLen uint32
	info    uint64
}

func objInfo(fd int, info *linkInfo) unix.Errno {
	attr := objInfoAttr{fd: uint32(fd), infoLen: uint32(unsafe.Sizeof(*info)), info: uint64(uintptr(unsafe.Pointer(info)))}
	_, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_OBJ_GET_INFO_BY_FD, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	runtime.KeepAlive(info)
	return errno
}

func ptr[T any](s []T) uint64 {
	if len(s) == 0 {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(&s[0])))
}

func addr(p *byte) uint64 { return uint64(uintptr(unsafe.Pointer(p))) }
