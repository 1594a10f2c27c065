package fallback

import (
	"errors"
	"fmt"
	"sync"

	"github.com/multiprobe/multiprobe/internal/fds"
	"golang.org/x/sys/unix"
)

// ErrFDBudget: the sites need more file descriptors than RLIMIT_NOFILE's
// hard limit allows.
var ErrFDBudget = errors.New("not enough file descriptors for per-site uprobes")

// fdSlack covers the descriptors cilium/ebpf opens for a moment while
// attaching (feature probes, the binary) and those other goroutines may open
// meanwhile.
const fdSlack = 64

var rlimitMu sync.Mutex

// ensureFDs makes sure the process can open need more descriptors: it
// raises the soft RLIMIT_NOFILE up to the hard limit if the current soft
// limit is too low, and fails with ErrFDBudget if even the hard limit is.
func ensureFDs(need int) error {
	open, err := fds.Count()
	if err != nil {
		return fmt.Errorf("fallback: counting open file descriptors: %w", err)
	}
	want := uint64(open) + uint64(need) + fdSlack

	rlimitMu.Lock()
	defer rlimitMu.Unlock()
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("fallback: getrlimit(RLIMIT_NOFILE): %w", err)
	}
	if lim.Cur >= want {
		return nil
	}
	if lim.Max < want {
		return fmt.Errorf("fallback: %d sites need %d file descriptors (%d open, %d spare), but RLIMIT_NOFILE's hard limit is %d: "+
			"raise it (ulimit -Hn, LimitNOFILE= in systemd) or attach fewer sites: %w",
			need/2, need, open, fdSlack, lim.Max, ErrFDBudget)
	}
	lim.Cur = lim.Max
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("fallback: raising the soft RLIMIT_NOFILE to %d for %d file descriptors: %w", lim.Max, need, err)
	}
	return nil
}
