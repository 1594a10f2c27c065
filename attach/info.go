package attach

import (
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/multiprobe/multiprobe/internal/bpfsys"
)

// LinkInfo is what the kernel reports about one uprobe_multi link. The
// kernel (as of Linux 6.18) keeps no missed-events count for uprobe_multi
// links, so there is none here.
type LinkInfo struct {
	// ID is the kernel's link ID, as `bpftool link` lists it.
	ID link.ID
	// Program is the ID of the attached program.
	Program ebpf.ProgramID
	// Path is the binary as the kernel names it now: it follows renames,
	// and ends in " (deleted)" once the file the link holds is unlinked
	// (a package upgrade replaces a library that way).
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
	out := make([]LinkInfo, len(l.links))
	for i, kl := range l.links {
		info, err := infoOf(kl)
		if err != nil {
			return nil, fmt.Errorf("attach: info of the link for %s: %w", l.targets[l.spans[i].target].Path, err)
		}
		info.Target, info.First = l.spans[i].target, l.spans[i].first
		out[i] = info
	}
	return out, nil
}

// infoOf converts cilium/ebpf's info of a uprobe_multi link.
func infoOf(kl link.Link) (LinkInfo, error) {
	info, err := kl.Info()
	if err != nil {
		return LinkInfo{}, err
	}
	um := info.UprobeMulti()
	if um == nil {
		return LinkInfo{}, fmt.Errorf("link %d has type %d, not uprobe_multi", info.ID, info.Type)
	}
	li := LinkInfo{ID: info.ID, Program: info.Program, Path: um.File, Return: um.Flags&bpfsys.FlagUprobeMultiReturn != 0}
	if pid, ok := um.Pid(); ok {
		li.PID = pid
	}
	offs, _ := um.Offsets()
	li.Offsets = make([]uint64, len(offs))
	li.RefCtrOffsets = make([]uint64, len(offs))
	li.Cookies = make([]uint64, len(offs))
	for i, o := range offs {
		li.Offsets[i], li.RefCtrOffsets[i], li.Cookies[i] = o.Offset, o.ReferenceCount, o.Cookie
	}
	return li, nil
}
