package bpfsys

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// LinkGrace bounds how long Close waits for the kernel to free a link: a
// walker of the kernel's links that is descheduled while it holds one on a
// loaded machine can keep it for a while. A variable for tests that hold
// links on purpose.
var LinkGrace = 5 * time.Second

// WaitLinksFreed returns once no link of ids exists any more, or after
// LinkGrace. Closing a link's descriptor detaches its program only when it
// was the last reference: another process that opened the link by ID at
// that moment (bpftool, a tool walking the kernel's links) keeps it, and
// the program running, until it closes its own. Waiting makes Close mean
// what callers take it to mean, that nothing fires after it returns, as
// long as no one holds a link for longer.
func WaitLinksFreed(ids []link.ID) {
	deadline := time.Now().Add(LinkGrace)
	for _, id := range ids {
		for {
			l, err := link.NewFromID(id)
			if errors.Is(err, os.ErrNotExist) || (err != nil && !errors.Is(err, os.ErrPermission)) {
				break
			}
			if l != nil {
				l.Close()
			}
			if err != nil || time.Now().After(deadline) {
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
}

// Pinned reports whether l is pinned by this process (cilium/ebpf's links
// remember where): such a link stays attached after Close, so there is
// nothing to wait for.
func Pinned(l link.Link) bool {
	p, ok := l.(interface{ IsPinned() bool })
	return ok && p.IsPinned()
}

// PinAll pins links[i] as dir/i, all or nothing: on error the pins made
// are removed and the error names the index that failed.
func PinAll(links []link.Link, dir string) (int, error) {
	for i, kl := range links {
		if err := kl.Pin(filepath.Join(dir, strconv.Itoa(i))); err != nil {
			for _, done := range links[:i] {
				_ = done.Unpin()
			}
			return i, err
		}
	}
	return 0, nil
}

// PinAgain pins links[i] as dir/i too, through a second handle of each, so
// that the pins the links have elsewhere stay where they are (cilium/ebpf's
// Pin would move them): a pinned set of links can be laid out anew before
// the old layout is removed.
func PinAgain(links []link.Link, dir string) error {
	for i, kl := range links {
		fdl, ok := kl.(interface{ FD() int })
		if !ok {
			return fmt.Errorf("link %d has no descriptor to pin: %w", i, ebpf.ErrNotSupported)
		}
		id, errno := LinkID(fdl.FD())
		if errno != 0 {
			return fmt.Errorf("link %d: %w", i, errno)
		}
		h, err := link.NewFromID(id)
		if err != nil {
			return err
		}
		err = h.Pin(filepath.Join(dir, strconv.Itoa(i)))
		h.Close()
		if err != nil {
			return err
		}
	}
	return nil
}
