// Package fds counts this process's open file descriptors, which the
// per-site attach path spends two of per site and which tests check are
// all given back, and opens the files that multiprobe reads so that a FIFO
// or a device cannot hang or feed it.
package fds

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

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

// ErrNotRegular is returned by OpenRegular for a path that is not a
// regular file (a FIFO, a device, a directory).
var ErrNotRegular = errors.New("not a regular file")

// OpenRegular opens path for reading if it is a regular file. The open
// does not block on a FIFO and does not make a terminal the controlling
// one: the type is checked on the opened descriptor, so a file swapped in
// between cannot slip past the check.
func OpenRegular(path string) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
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
