package testutil

import (
	"testing"

	"golang.org/x/sys/unix"
)

// BPFFS mounts a BPF filesystem of the test's own on a temporary directory
// and returns it; the test's cleanup unmounts it, which removes every pin
// left there. Tests do not share the machine's /sys/fs/bpf, which guests
// and fresh hosts may not even have mounted.
func BPFFS(tb testing.TB) string {
	tb.Helper()
	dir := tb.TempDir()
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		tb.Fatalf("mounting a BPF filesystem on %s: %v", dir, err)
	}
	tb.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			tb.Errorf("unmounting the BPF filesystem on %s: %v", dir, err)
		}
	})
	return dir
}
