package fallback

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/multiprobe/multiprobe/internal/bpfsys"
	"github.com/multiprobe/multiprobe/internal/target"
)

// ErrPinUnsupported: the kernel attaches perf-event uprobes with an ioctl
// and has no BPF perf links to pin (before Linux 5.15). It wraps
// ebpf.ErrNotSupported.
var ErrPinUnsupported = target.Unsupported("kernel has no BPF perf links to pin (Linux 5.15+)")

// Pin pins every site's BPF perf link in dir, a directory on a BPF
// filesystem that must exist, as files named 0, 1, ... in site order. A
// pinned site stays attached after Close and after this process exits,
// until its pin is removed. Pin is all or nothing; before Linux 5.15 it
// fails with ErrPinUnsupported.
func (l *Link) Pin(dir string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return fmt.Errorf("fallback: pin of a closed link: %w", os.ErrClosed)
	}
	if i, err := bpfsys.PinAll(l.links, dir); err != nil {
		if errors.Is(err, ebpf.ErrNotSupported) {
			err = ErrPinUnsupported
		}
		return fmt.Errorf("fallback: pinning site %d in %s: %w", i, dir, err)
	}
	return nil
}

// Unpin removes the pins of l's sites; Close then detaches them.
func (l *Link) Unpin() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var errs []error
	for _, kl := range l.links {
		errs = append(errs, kl.Unpin())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("fallback: %w", err)
	}
	return nil
}

// LoadPinned takes back the per-site links that Link.Pin pinned in dir,
// whose targets were targets (as Link.Targets returned them). The Link it
// returns is pinned: Close releases its descriptors and leaves the probes
// attached; Unpin, then Close, detaches them.
func LoadPinned(dir string, targets []Target) (*Link, error) {
	ts := target.Targets(slices.Clone(targets))
	n := ts.Sites()
	l := &Link{targets: ts, links: make([]link.Link, 0, n)}
	for i := range n {
		kl, err := link.LoadPinnedLink(filepath.Join(dir, strconv.Itoa(i)), nil)
		if err == nil {
			var info *link.Info
			if info, err = kl.Info(); err == nil && info.Type != link.PerfEventType {
				err = fmt.Errorf("link %d has type %d, not a perf event link", info.ID, info.Type)
			}
			l.links = append(l.links, kl)
			l.fds++
		}
		if err != nil {
			return nil, l.abort(fmt.Errorf("fallback: taking back site %d of %d from %s: %w", i, n, dir, err))
		}
	}
	return l, nil
}

// Split moves the sites of the targets for which keep returns true into a
// new Link and returns it; l keeps the others. Each Link then closes (or
// pins) only its own. A change of the probe set keeps the sites of
// binaries that stay and closes the rest.
func (l *Link) Split(keep func(target int) bool) *Link {
	l.mu.Lock()
	defer l.mu.Unlock()
	kept, rest := &Link{progress: l.progress}, &Link{progress: l.progress}
	site := 0
	for ti, t := range l.targets {
		to := rest
		if keep(ti) {
			to = kept
		}
		to.targets = append(to.targets, t)
		for range t.Offsets {
			lk := l.links[site]
			to.links = append(to.links, lk)
			to.fds += fdsOf(lk)
			site++
		}
	}
	l.targets, l.links, l.fds = rest.targets, rest.links, rest.fds
	return kept
}

// PinAgain pins l's per-site links in dir as Pin does, through second
// handles, leaving the pins they have where they are: a pinned set can be
// laid out anew before the old layout is removed.
func (l *Link) PinAgain(dir string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := bpfsys.PinAgain(l.links, dir); err != nil {
		if errors.Is(err, ebpf.ErrNotSupported) {
			err = ErrPinUnsupported
		}
		return fmt.Errorf("fallback: pinning in %s: %w", dir, err)
	}
	return nil
}
