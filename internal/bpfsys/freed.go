package bpfsys

import (
	"errors"
	"os"
	"time"

	"github.com/cilium/ebpf/link"
)

// LinkGrace bounds how long Close waits for the kernel to free a link: a
// walker of the kernel's links that is descheduled while it holds one on a
// loaded machine can keep it for a while.
const LinkGrace = 5 * time.Second

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
