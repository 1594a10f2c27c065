package fds

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// Count returns how many file descriptors this process has open.
func Count() (int, error) {
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		return 0, err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return 0, err
	}
	// The directory itself was open while it was listed.
	return len(names) - 1, nil
}

// OpenRegular opens path for reading if it is a regular file. The open
// does not block on a FIFO and does not make a terminal the controlling
// one: the type is checked on the opened descriptor, so a file swapped in
// between cannot slip past the check.
//
// A path into another process's root, /proc/PID/root/REST, is opened
// inside that root (openat2 with RESOLVE_IN_ROOT, Linux 5.6): "..",
// absolute symbolic links and absolute names in REST resolve as the
// process itself would resolve them, never to the host's files, so a
// container cannot choose which host file multiprobe reads or probes.
func OpenRegular(path string) (*os.File, error) {
	flags := unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NONBLOCK | unix.O_NOCTTY
	var fd int
	var err error
	if root, rest, ok := SplitProcRoot(path); ok {
		fd, err = openInRoot(root, rest, flags)
	} else {
		fd, err = unix.Open(path, flags, 0)
	}
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &fs.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, fmt.Errorf("%s: %w", path, ErrNotRegular)
	}
	return os.NewFile(uintptr(fd), path), nil
}

var rlimitMu sync.Mutex

// Ensure makes sure the process can open need more descriptors, for what
// (such as "100 per-site uprobes"), before anything is made: it raises the
// soft RLIMIT_NOFILE up to the hard limit if the soft one is too low, and
// fails with ErrBudget if even the hard limit is. Running out part way
// would fail with EMFILE wherever it happened to, and cilium/ebpf caches
// some feature probes that fail so as unsupported features.
func Ensure(need int, what string) error {
	open, err := Count()
	if err != nil {
		return fmt.Errorf("counting open file descriptors: %w", err)
	}
	want := uint64(open) + uint64(need) + slack

	rlimitMu.Lock()
	defer rlimitMu.Unlock()
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("getrlimit(RLIMIT_NOFILE): %w", err)
	}
	if lim.Cur >= want {
		return nil
	}
	if lim.Max < want {
		return fmt.Errorf("%s need %d file descriptors (%d open, %d spare), but RLIMIT_NOFILE's hard limit is %d: "+
			"raise it (ulimit -Hn, LimitNOFILE= in systemd) or attach fewer sites: %w",
			what, need, open, slack, lim.Max, ErrBudget)
	}
	lim.Cur = lim.Max
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("raising the soft RLIMIT_NOFILE to %d for %d file descriptors: %w", lim.Max, need, err)
	}
	return nil
}

// openInRoot opens rest inside the directory root, confined to it.
func openInRoot(root, rest string, flags int) (int, error) {
	dir, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(dir)
	if rest == "" {
		rest = "."
	}
	fd, err := unix.Openat2(dir, rest, &unix.OpenHow{
		Flags:   uint64(flags),
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	if errors.Is(err, unix.ENOSYS) {
		return -1, fmt.Errorf("opening a file inside %s needs openat2 (Linux 5.6): %w", root, err)
	}
	return fd, err
}
