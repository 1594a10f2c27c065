//go:build linux

package watch

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/internal/testprogs"
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
	probetest.RequireBPF(t)
	f, err := kernelprobe.Detect()
	if err != nil {
		t.Fatal(err)
	}
	const containers, calls, interval = 20, 300, 5 * time.Millisecond
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
