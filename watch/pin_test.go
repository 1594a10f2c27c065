package watch

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/probetest"
)

// TestWatchPinRestart: a Watch with PinDir leaves its links pinned at
// Close, and the next takes them back: a program that makes its calls
// while no Watch runs has each counted, the file is reported Restored
// with its process as a user, and Unpin then Close leave nothing.
func TestWatchPinRestart(t *testing.T) {
	eachPath(t, testWatchPinRestart)
}

func testWatchPinRestart(t *testing.T, f kernelprobe.Features) {
	// BPF perf links, which can be pinned, came with BPF cookies (5.15).
	testutil.RequireKernelFeature(t, f.Cookies || f.Path() == kernelprobe.PathUprobeMulti, "pinnable uprobe links (Linux 5.15)")
	const n, calls = 5, 3
	target := filepath.Join(t.TempDir(), "restarted")
	if err := os.Rename(testprogs.PrivateTarget(t, n), target); err != nil {
		t.Fatal(err)
	}
	pins := filepath.Join(testutil.BPFFS(t), "watch")
	spec, c := loadCounter(t, f)
	probes, err := multiprobe.ParseProbes("uprobe:restarted:func_*")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var reports []Report
	opts := &Options{Plan: multiprobe.Options{Features: &f}, PinDir: pins, Report: func(r Report) {
		mu.Lock()
		reports = append(reports, r)
		mu.Unlock()
	}}
	before := probetest.TakeSnapshot(t)
	p := testprogs.Start(t, target, "-wait", fmt.Sprint(calls))
	w, err := New(probes, spec, c.CountEntry, opts)
	if err != nil {
		t.Fatal(err)
	}
	if files := w.Files(); len(files) != 1 {
		t.Fatalf("%d files attached, want 1", len(files))
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	// No Watch runs: the pinned link counts.
	p.Finish(t)
	checkCounts(t, c, n, calls, 1)

	// The next Watch takes it back, and a process running the file is
	// one of its users.
	p = testprogs.Start(t, target, "-wait", fmt.Sprint(calls))
	mu.Lock()
	reports = nil
	mu.Unlock()
	if w, err = New(probes, spec, c.CountEntry, opts); err != nil {
		t.Fatal(err)
	}
	files := w.Files()
	mu.Lock()
	restored := len(reports) > 0 && reports[0].What == Restored && len(reports[0].Sites) == n && reports[0].Sites[0].Probe.Target == "restarted"
	mu.Unlock()
	if len(files) != 1 || files[0].Users != 1 || !restored {
		mu.Lock()
		t.Fatalf("after a restart: files %+v, reports %+v; want one file restored, with one user", files, reports)
	}
	p.Finish(t)
	checkCounts(t, c, n, calls, 2)
	if err := w.Unpin(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(pins); len(ents) != 0 {
		t.Errorf("%d pins left after Unpin and Close", len(ents))
	}
	before.Check(t, "after Unpin and Close")
}
