package testutil

import "github.com/multiprobe/multiprobe/internal/fds"

// OpenFDs returns how many file descriptors this process has open, so that a
// test can check that a Close released everything.
func OpenFDs() (int, error) { return fds.Count() }
