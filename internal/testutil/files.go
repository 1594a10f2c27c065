package testutil

import (
	"os"
	"path/filepath"
	"testing"
)

// OpenReplaced copies src to a new file, opens the copy, and then renames
// another file (a shell script) over its path: the descriptor it returns
// still reads the copy, and the path it returns names the other file. A
// test of a reader that is handed an open file checks with it that the
// reader reads the descriptor's file, not the path's. The descriptor is
// closed when the test ends.
func OpenReplaced(tb testing.TB, src string) (*os.File, string) {
	tb.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		tb.Fatal(err)
	}
	dir := tb.TempDir()
	path := filepath.Join(dir, filepath.Base(src))
	if err := os.WriteFile(path, data, 0o755); err != nil {
		tb.Fatal(err)
	}
	fd, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { fd.Close() })
	other := filepath.Join(dir, "other")
	if err := os.WriteFile(other, []byte("#!/bin/sh\n"), 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.Rename(other, path); err != nil {
		tb.Fatal(err)
	}
	return fd, path
}
