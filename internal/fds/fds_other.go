//go:build !linux

package fds

import (
	"fmt"
	"io/fs"
	"os"
	"runtime"

	"github.com/cilium/ebpf"
)

// errNotLinux is what every function that needs Linux's /proc or
// RLIMIT_NOFILE returns elsewhere.
var errNotLinux = fmt.Errorf("multiprobe on %s: %w", runtime.GOOS, ebpf.ErrNotSupported)

// Count returns how many file descriptors this process has open: only on
// Linux.
func Count() (int, error) { return 0, errNotLinux }

// OpenRegular opens path for reading if it is a regular file. Outside
// Linux the type is checked on the opened file, without the flags that
// keep a FIFO from blocking the open.
func OpenRegular(path string) (*os.File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, &fs.PathError{Op: "stat", Path: path, Err: err}
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, ErrNotRegular)
	}
	return f, nil
}

// Ensure needs Linux.
func Ensure(need int, what string) error { return errNotLinux }
