package attach

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/cilium/ebpf/link"
	"github.com/multiprobe/multiprobe/internal/bpfsys"
	"github.com/multiprobe/multiprobe/internal/target"
)

// Pin pins l's kernel links in dir, a directory on a BPF filesystem that
// must exist, as files named 0, 1, ... in the order of Info. A pinned link
// stays attached after Close and after this process exits, until its pin
// is removed (Unpin, or LoadPinned and Unpin in another process). Pin is
// all or nothing.
func (l *Link) Pin(dir string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return fmt.Errorf("attach: pin of a closed link: %w", os.ErrClosed)
	}
	if i, err := bpfsys.PinAll(l.links, dir); err != nil {
		return fmt.Errorf("attach: pinning the link for %s in %s: %w", l.targets[l.spans[i].target].Path, dir, err)
	}
	return nil
}

// Unpin removes the pins of l's kernel links; Close then detaches them.
func (l *Link) Unpin() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var errs []error
	for i, kl := range l.links {
		if err := kl.Unpin(); err != nil {
			errs = append(errs, fmt.Errorf("attach: unpinning the link for %s: %w", l.targets[l.spans[i].target].Path, err))
		}
	}
	return errors.Join(errs...)
}

// ErrPinMismatch: the links pinned in a directory do not hold the sites
// LoadPinned was told they hold.
var ErrPinMismatch = errors.New("pinned links do not match their targets")

// LoadPinned takes back the kernel links that Link.Pin pinned in dir,
// whose targets were targets (as Link.Targets returned them; Path names a
// binary in messages, File is not used). It checks that each link is a
// uprobe_multi link holding exactly its targets' offsets and cookies, and
// fails with an error wrapping ErrPinMismatch if one does not. The Link it
// returns is pinned: Close releases its descriptors and leaves the probes
// attached; Unpin, then Close, detaches them.
func LoadPinned(dir string, targets []Target) (_ *Link, err error) {
	ts := Targets(slices.Clone(targets))
	cookies := ts.Cookies()
	l := &Link{targets: ts}
	defer func() {
		if err != nil {
			err = errors.Join(err, l.Close())
		}
	}()
	next := 0 // the first cookie of target ti, in cookies
	for ti := range ts {
		t := &ts[ti]
		for first := 0; first < len(t.Offsets); {
			path := filepath.Join(dir, strconv.Itoa(len(l.links)))
			kl, err := link.LoadPinnedLink(path, nil)
			if err != nil {
				return nil, fmt.Errorf("attach: taking back the link for %s: %w", t.Path, err)
			}
			id, _ := bpfsys.LinkID(rawFD(kl))
			l.links = append(l.links, kl)
			l.ids = append(l.ids, id)
			info, err := infoOf(kl)
			if err != nil {
				return nil, fmt.Errorf("attach: %s (for %s): %w", path, t.Path, err)
			}
			end := first + len(info.Offsets)
			if len(info.Offsets) == 0 || end > len(t.Offsets) ||
				!slices.Equal(info.Offsets, t.Offsets[first:end]) ||
				!slices.Equal(info.Cookies, cookies[next+first:next+end]) {
				return nil, fmt.Errorf("attach: %s holds %d sites that are not %s's %s to %s: %w",
					path, len(info.Offsets), t.Path, target.SiteName(t, first), target.SiteName(t, min(end, len(t.Offsets))-1), ErrPinMismatch)
			}
			l.spans = append(l.spans, span{ti, first, end})
			first = end
		}
		next += len(t.Offsets)
	}
	return l, nil
}

// rawFD is a cilium/ebpf link's descriptor.
func rawFD(kl link.Link) int {
	if r, ok := kl.(interface{ FD() int }); ok {
		return r.FD()
	}
	return -1
}

// Split moves the kernel links of the targets for which keep returns true
// into a new Link and returns it; l keeps the others. Each Link then
// closes (or pins) only its own. A change of the probe set keeps the
// links of binaries whose sites stay and closes the rest.
func (l *Link) Split(keep func(target int) bool) *Link {
	l.mu.Lock()
	defer l.mu.Unlock()
	kept, rest := &Link{}, &Link{}
	renum := make([]int, len(l.targets)) // old target index -> new, in its Link
	into := make([]*Link, len(l.targets))
	for ti, t := range l.targets {
		to := rest
		if keep(ti) {
			to = kept
		}
		into[ti], renum[ti] = to, len(to.targets)
		to.targets = append(to.targets, t)
	}
	for i, sp := range l.spans {
		to := into[sp.target]
		to.links = append(to.links, l.links[i])
		to.ids = append(to.ids, l.ids[i])
		to.spans = append(to.spans, span{renum[sp.target], sp.first, sp.end})
	}
	l.targets, l.links, l.ids, l.spans = rest.targets, rest.links, rest.ids, rest.spans
	return kept
}

// PinAgain pins l's kernel links in dir as Pin does, through second
// handles, leaving the pins they have where they are: a pinned set can be
// laid out anew before the old layout is removed.
func (l *Link) PinAgain(dir string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := bpfsys.PinAgain(l.links, dir); err != nil {
		return fmt.Errorf("attach: pinning in %s: %w", dir, err)
	}
	return nil
}
