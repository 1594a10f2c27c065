//go:build linux

package watch

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/probetest"
)

// monotonic is CLOCK_MONOTONIC in nanoseconds, the clock the workloads
// report their first call by.
func monotonic() int64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// TestWatchChroots: with the watch on uprobe:libc:malloc, 20 containers
// started after it, each chrooted into a root of its own with its own copy
// of libc (another inode), in a mount namespace of its own, get their
// malloc calls counted from the moment their libc is attached. The
// workload calls malloc on a schedule from its start, one call every
// interval, and nothing else calls it, so the calls missed (made before
// the link was in place) can be at most those due before the watch
// reported the copy attached. The copies are one build, resolved once.
func TestWatchChroots(t *testing.T) {
	requireEvents(t)
	f, err := kernelprobe.Detect()
	if err != nil {
		t.Fatal(err)
	}
	const containers, calls = 20, 300
	// Each container lives calls*interval: long enough for the watch to
	// reach it before it exits, which an emulated guest, attaching the
	// copies one after another, takes up to 2 s to (arm64 under
	// single-threaded TCG).
	interval := 5 * time.Millisecond
	if testutil.InGuest() {
		interval = 20 * time.Millisecond
	}
	prog := testprogs.MallocsTarget(t)
	var roots []string
	for range containers {
		roots = append(roots, testprogs.ContainerRoot(t, prog))
	}
	spec, c := loadCounter(t, f)
	probes, err := multiprobe.ParseProbes("uprobe:libc:malloc")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	attachedAt := map[int]int64{} // by the pid that mapped the copy first
	resolved := map[int]bool{}    // not Reused
	w, err := New(probes, spec, c.CountEntry, &Options{Plan: multiprobe.Options{Features: &f}, Report: func(r Report) {
		now := monotonic()
		mu.Lock()
		defer mu.Unlock()
		switch r.What {
		case Attached:
			attachedAt[r.PID] = now
			resolved[r.PID] = !r.Reused
		case Skipped:
			t.Errorf("skipped %s (process %d): %v", r.Path, r.PID, r.Err)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()

	type run struct {
		pid   int
		out   strings.Builder
		first int64
		n     uint64
	}
	runs := make([]*run, containers)
	var g sync.WaitGroup
	for i, root := range roots {
		r := &run{}
		runs[i] = r
		cmd := testprogs.ContainerCommand(root, "target", fmt.Sprint(calls), fmt.Sprint(interval.Microseconds()))
		cmd.Stdout = &r.out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		r.pid = cmd.Process.Pid
		g.Add(1)
		go func() {
			defer g.Done()
			if err := cmd.Wait(); err != nil {
				t.Errorf("container %d: %v", i, err)
			}
		}()
	}
	g.Wait()

	var missed, latencies []int64
	for i, r := range runs {
		if _, err := fmt.Sscanf(r.out.String(), "calls %d first %d", &r.n, &r.first); err != nil {
			t.Fatalf("container %d printed %q: %v", i, r.out.String(), err)
		}
		var counted uint64
		if err := c.PIDCounts.Lookup(uint32(r.pid), &counted); err != nil {
			counted = 0
		}
		mu.Lock()
		at, ok := attachedAt[r.pid]
		mu.Unlock()
		if !ok {
			t.Errorf("container %d (process %d): its libc was never reported attached; %d of %d calls counted", i, r.pid, counted, r.n)
			continue
		}
		// Calls are due at first + k*interval and none is early, so
		// those made before the report are at most this many.
		var due int64
		if at >= r.first {
			due = (at-r.first)/interval.Nanoseconds() + 1
		}
		miss := int64(r.n) - int64(counted)
		if miss < 0 || miss > due {
			t.Errorf("container %d: %d of %d malloc calls counted: %d missed, but only %d were due before its libc was attached (%v after its first call)",
				i, counted, r.n, miss, due, time.Duration(at-r.first))
		}
		missed = append(missed, miss)
		latencies = append(latencies, at-r.first)
	}
	// The copies are of one build: resolved once (or never, where this
	// machine's own libc was attached already), then retargeted.
	k := 0
	for _, r := range runs {
		if resolved[r.pid] {
			k++
		}
	}
	if k > 1 {
		t.Errorf("%d of %d copies of one libc were resolved, want at most one (the others retargeted)", k, containers)
	}
	slices.Sort(latencies)
	var total int64
	for _, m := range missed {
		total += m
	}
	if len(latencies) > 0 {
		t.Logf("%d containers: %d of %d calls missed in all (before their libc was attached); attached %v (median) to %v (most) after the first call",
			len(latencies), total, int64(len(latencies))*calls, time.Duration(latencies[len(latencies)/2]), time.Duration(latencies[len(latencies)-1]))
	}
}

// TestWatchChurn: 1,000 containers (100 in an emulated guest) start and
// exit, each running its own copy of a program, deleted after it exits:
// each copy is attached and then detached, and at the end the file
// descriptors, the kernel's links, the watch's own tables and the Go heap
// are back where they started.
func TestWatchChurn(t *testing.T) {
	requireEvents(t)
	f, err := kernelprobe.Detect()
	if err != nil {
		t.Fatal(err)
	}
	containers := 1000
	if testutil.InGuest() {
		containers = 100
	}
	target := filepath.Join(t.TempDir(), "churned")
	if err := os.Rename(testprogs.PrivateTarget(t, 5), target); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	spec, c := loadCounter(t, f)
	probes, err := multiprobe.ParseProbes("uprobe:" + dir + "/churned*:func_*")
	if err != nil {
		t.Fatal(err)
	}
	var attached, detached atomic.Int64
	w, err := New(probes, spec, c.CountEntry, &Options{Plan: multiprobe.Options{Features: &f}, Report: func(r Report) {
		switch r.What {
		case Attached:
			attached.Add(1)
		case Detached:
			detached.Add(1)
		case Skipped:
			t.Errorf("skipped %s: %v", r.Path, r.Err)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	data, err := os.ReadFile(target)
	if err != nil {
		t.Fatal(err)
	}
	var waits []time.Duration // from a container's start to its copy attached
	start := func(i int) {
		t.Helper()
		copy := filepath.Join(dir, fmt.Sprint("churned", i))
		if err := os.WriteFile(copy, data, 0o755); err != nil {
			t.Fatal(err)
		}
		// Each lives until its copy is attached: one that exits before
		// the watch reads its mappings is not attached at all.
		want := attached.Load() + 1
		cmd := exec.Command(copy, "-wait", "1")
		in, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		var out strings.Builder
		cmd.Stdout = &out
		t0 := time.Now()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); attached.Load() < want; time.Sleep(100 * time.Microsecond) {
			if time.Now().After(deadline) {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("%s was not attached", copy)
			}
		}
		waits = append(waits, time.Since(t0))
		in.Close()
		if err := cmd.Wait(); err != nil {
			t.Fatalf("%s: %v\n%s", copy, err, out.String())
		}
		if err := os.Remove(copy); err != nil {
			t.Fatal(err)
		}
	}
	settle := func() {
		t.Helper()
		exec.Command("true").Run() // an exit, after which the watch sweeps
		for deadline := time.Now().Add(20 * time.Second); len(w.Files()) > 0 || detached.Load() < attached.Load(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d files still attached: %+v", len(w.Files()), w.Files())
			}
			exec.Command("true").Run()
		}
	}
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	// Warm up: the first of everything allocates what stays.
	for i := range 10 {
		start(i)
	}
	settle()
	before, heapBefore := probetest.TakeSnapshot(t, c.CountEntry), heap()
	attachedBefore := attached.Load()
	for i := range containers {
		start(10 + i)
	}
	settle()
	if got := attached.Load() - attachedBefore; got != int64(containers) {
		t.Errorf("%d copies attached, want %d", got, containers)
	}
	if a, d := attached.Load(), detached.Load(); a != d {
		t.Errorf("%d attached, %d detached", a, d)
	}
	before.Check(t, fmt.Sprintf("after %d containers", containers))
	w.mu.Lock()
	if len(w.files) != 0 || len(w.builds) != 0 || len(w.tr.files) != 0 || len(w.tr.byPID) != 0 {
		t.Errorf("the watch still holds %d files, %d builds, %d tracked files, %d processes",
			len(w.files), len(w.builds), len(w.tr.files), len(w.tr.byPID))
	}
	w.mu.Unlock()
	// Within 1 MiB, what the runtime's own pools leave about (a heap
	// profile of the difference shows nothing of the watch's): a leak of
	// 1 KiB a container would pass it.
	after := heap()
	if after > heapBefore+1<<20 {
		t.Errorf("Go heap %d KiB after %d containers, %d KiB before", after>>10, containers, heapBefore>>10)
	}
	slices.Sort(waits)
	t.Logf("%d containers attached and detached; Go heap %d KiB before, %d KiB after; start to attached: %v median, %v at the 99th percentile",
		containers, heapBefore>>10, after>>10, waits[len(waits)/2], waits[len(waits)*99/100])
}
