package attach

import (
	"fmt"
	"os"
	"runtime"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/multiprobe/multiprobe/internal/bpfsys"
	"golang.org/x/sys/unix"
)

// LinkInfo is what the kernel reports about one uprobe_multi link. The
// kernel (as of Linux 6.18) keeps no missed-events count for uprobe_multi
// links, so there is none here.
type LinkInfo struct {
	// ID is the kernel's link ID, as `bpftool link` lists it.
	ID link.ID
	// Program is the ID of the attached program.
	Program ebpf.ProgramID
	// Path is the binary as the kernel names it now (it follows renames).
	Path string
	// Target is the index of the link's target in Link.Targets, and First
	// the index of its first site there (non-zero when a target with more
	// than MaxSitesPerLink sites was split).
	Target, First int
	// Offsets, RefCtrOffsets and Cookies are the sites as the kernel holds
	// them, one entry per site.
	Offsets, RefCtrOffsets, Cookies []uint64
	// Return reports return probes.
	Return bool
	// PID is the pid filter, 0 for none.
	PID uint32
}

// Info asks the kernel about each of l's links, in the order of the
// targets and their sites.
func (l *Link) Info() ([]LinkInfo, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, fmt.Errorf("attach: info of a closed link: %w", os.ErrClosed)
	}
	out := make([]LinkInfo, len(l.files))
	for i, f := range l.files {
		info, err := queryInfo(int(f.Fd()))
		if err != nil {
			return nil, fmt.Errorf("attach: info of the link for %s: %w", l.targets[l.spans[i].target].Path, err)
		}
		info.Target, info.First = l.spans[i].target, l.spans[i].first
		out[i] = info
	}
	return out, nil
}

func queryInfo(fd int) (LinkInfo, error) {
	// The first call gets the sizes, the second the contents.
	var sizes bpfsys.UprobeMultiInfo
	if errno := bpfsys.ObjInfo(fd, &sizes); errno != 0 {
		return LinkInfo{}, errno
	}
	if link.Type(sizes.Type) != link.UprobeMultiType {
		return LinkInfo{}, fmt.Errorf("link type %d is not uprobe_multi", sizes.Type)
	}
	n := max(int(sizes.Count), 1)
	path := make([]byte, max(sizes.PathSize, 1))
	offsets := make([]uint64, n)
	refCtr := make([]uint64, n)
	cookies := make([]uint64, n)
	info := bpfsys.UprobeMultiInfo{
		Path:          bpfsys.Ptr(path),
		PathSize:      uint32(len(path)),
		Offsets:       bpfsys.Ptr(offsets),
		RefCtrOffsets: bpfsys.Ptr(refCtr),
		Cookies:       bpfsys.Ptr(cookies),
		Count:         uint32(n),
	}
	errno := bpfsys.ObjInfo(fd, &info)
	runtime.KeepAlive(path)
	runtime.KeepAlive(offsets)
	runtime.KeepAlive(refCtr)
	runtime.KeepAlive(cookies)
	if errno != 0 {
		return LinkInfo{}, errno
	}
	n = int(info.Count)
	return LinkInfo{
		ID:            link.ID(info.ID),
		Program:       ebpf.ProgramID(info.ProgID),
		Path:          unix.ByteSliceToString(path),
		Offsets:       offsets[:n],
		RefCtrOffsets: refCtr[:n],
		Cookies:       cookies[:n],
		Return:        info.Flags&bpfsys.FlagUprobeMultiReturn != 0,
		PID:           info.PID,
	}, nil
}
