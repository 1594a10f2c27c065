//go:build linux

package watch

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/kernelprobe"
)

// TestWatchOverlay: ten containers of one image, each seeing the image's
// program through an overlay mount of its own over one lower layer, run
// one file as the kernel sees it (the lower layer's), where one uprobe
// serves them all: the watch attaches it once, counts ten users, and
// every call is counted once.
func TestWatchOverlay(t *testing.T) {
	requireEvents(t)
	f, err := kernelprobe.Detect()
	if err != nil {
		t.Fatal(err)
	}
	const n, mounts, calls = 5, 10, 3
	dir := t.TempDir()
	lower := filepath.Join(dir, "lower")
	if err := os.Mkdir(lower, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(testprogs.PrivateTarget(t, n), filepath.Join(lower, "overlaid")); err != nil {
		t.Fatal(err)
	}
	var targets []string
	for i := range mounts {
		layer := func(name string) string {
			p := filepath.Join(dir, fmt.Sprint(name, i))
			if err := os.Mkdir(p, 0o755); err != nil {
				t.Fatal(err)
			}
			return p
		}
		upper, work, mnt := layer("upper"), layer("work"), layer("mnt")
		err := unix.Mount("overlay", mnt, "overlay", 0, "lowerdir="+lower+",upperdir="+upper+",workdir="+work)
		if errors.Is(err, unix.ENODEV) && testutil.InGuest() {
			t.Skip("this guest's kernel has no overlayfs built in")
		}
		if err != nil {
			t.Fatalf("mounting an overlay on %s: %v", mnt, err)
		}
		t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
		targets = append(targets, filepath.Join(mnt, "overlaid"))
	}
	spec, c := loadCounter(t, f)
	probes, err := multiprobe.ParseProbes("uprobe:overlaid:func_*")
	if err != nil {
		t.Fatal(err)
	}
	var attached atomic.Int32
	w, err := New(probes, spec, c.CountEntry, &Options{Plan: multiprobe.Options{Features: &f}, Report: func(r Report) {
		if r.What == Attached {
			attached.Add(1)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	var procs []*testprogs.Proc
	for _, target := range targets {
		procs = append(procs, testprogs.Start(t, target, "-wait", "3"))
	}
	var files []File
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if files = w.Files(); len(files) == 1 && files[0].Users == mounts {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %d containers started: %+v, want one file with %d users", mounts, files, mounts)
		}
	}
	if got := attached.Load(); got != 1 {
		t.Errorf("%d Attached reports, want 1", got)
	}
	for _, p := range procs {
		p.Finish(t)
	}
	checkCounts(t, c, n, calls, mounts)
}
