package watch

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/probetest"
)

// loadSharing loads the counter from a spec prepared for f, counting into
// counts pinned in dir; second makes it the counter's second version
// (testprogs.CounterSpecV2).
func loadSharing(t *testing.T, f kernelprobe.Features, dir string, second bool) (*ebpf.CollectionSpec, *testprogs.Counter) {
	t.Helper()
	load := testprogs.CounterSpec
	if second {
		load = testprogs.CounterSpecV2
	}
	spec, err := load()
	if err != nil {
		t.Fatal(err)
	}
	if err := multiprobe.PrepareSpec(spec, &multiprobe.Options{Features: &f}); err != nil {
		t.Fatal(err)
	}
	c, err := testprogs.NewCounterSharing(spec, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return spec, c
}

// TestWatchPinUpdate: a Watch with a PinDir is closed, its links left
// pinned, and the next one runs with other probes (one function dropped,
// one added, two kept), or another version of the program too, while a
// process that the first one attached calls every function in a loop.
// The next Watch takes the link back, sees that it runs other probes or
// another program as the process maps the file, and brings it to its
// own, reported Updated: the functions kept miss no call, none counted
// twice where the links have the generation check (Updatable); from
// then on the new set counts, by the new program, and the dropped
// function does not. A Watch with none of the pinned probes detaches
// the link it takes back.
func TestWatchPinUpdate(t *testing.T) {
	eachPath(t, func(t *testing.T, f kernelprobe.Features) {
		testutil.RequireKernelFeature(t, f.Cookies || f.Path() == kernelprobe.PathUprobeMulti, "pinnable uprobe links (Linux 5.15)")
		for _, tc := range []struct {
			name               string
			updatable, program bool
		}{
			{"probes", true, false},
			{"program", true, true},
			{"not updatable", false, true},
		} {
			if tc.name == "probes" && testutil.InGuest() {
				continue // "program" changes the probes too, through the same UpdateProgram: CI's time
			}
			t.Run(tc.name, func(t *testing.T) { testWatchPinUpdate(t, f, tc.updatable, tc.program) })
		}
	})
}

func testWatchPinUpdate(t *testing.T, f kernelprobe.Features, updatable, program bool) {
	const n = 5
	// The first function's calls must take longer than the update,
	// which on the perf-event path attaches each site on its own.
	// Emulated arm64 takes ~0.1 ms a call there: it shows that the
	// update changes the link, and the x86-64 guests that calls go on
	// across it.
	calls, across := 500_000, true
	switch {
	case testutil.InGuest() && runtime.GOARCH == "arm64":
		calls, across = 10_000, false
	case testutil.InGuest() && f.Path() == kernelprobe.PathPerfEvent:
		calls = 400_000
	case testutil.InGuest():
		calls = 100_000
	}
	target := filepath.Join(t.TempDir(), "updated")
	if err := os.Rename(testprogs.PrivateTarget(t, n), target); err != nil {
		t.Fatal(err)
	}
	bpffs := testutil.BPFFS(t)
	pins := filepath.Join(bpffs, "watch")
	spec1, c1 := loadSharing(t, f, bpffs, false)
	spec2, c2 := spec1, c1
	if program {
		spec2, c2 = loadSharing(t, f, bpffs, true)
	}
	var mu sync.Mutex
	var reports []Report
	opts := &Options{Plan: multiprobe.Options{Features: &f, Updatable: updatable}, PinDir: pins, Report: func(r Report) {
		mu.Lock()
		reports = append(reports, r)
		mu.Unlock()
	}}
	before := probetest.TakeSnapshot(t)
	probes := func(specs string) []multiprobe.Probe {
		ps, err := multiprobe.ParseProbes(specs)
		if err != nil {
			t.Fatal(err)
		}
		return ps
	}
	cookies := func(w *Watch) map[string]uint64 {
		files := w.Files()
		if len(files) != 1 {
			t.Fatalf("%d files attached, want 1", len(files))
		}
		out := map[string]uint64{}
		for _, s := range files[0].Link.Sites() {
			out[s.Name] = s.Cookie
		}
		return out
	}

	p := testprogs.Start(t, target, "-wait", "1")
	w, err := New(probes("uprobe:updated:func_0000[012]"), spec1, c1.CountEntry, opts)
	if err != nil {
		t.Fatal(err)
	}
	old := cookies(w)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	p.Finish(t)

	// The process calls while the next Watch takes the link back and
	// updates it.
	first, err := testprogs.ReadArray(c1.Counts, 64)
	if err != nil {
		t.Fatal(err)
	}
	// The worker that updates the link lets it start first.
	p = testprogs.Start(t, target, "-wait", itoa(calls))
	finished := make(chan struct{})
	var once sync.Once
	testAttaching = func(string) {
		once.Do(func() {
			go func() {
				p.Finish(t)
				close(finished)
			}()
			time.Sleep(10 * time.Millisecond)
		})
	}
	defer func() { testAttaching = nil }()
	mu.Lock()
	reports = nil
	mu.Unlock()
	if w, err = New(probes("uprobe:updated:func_0000[013]"), spec2, c2.CountEntry, opts); err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	<-finished
	testAttaching = nil
	mu.Lock()
	var updated *Report
	for i := range reports {
		if reports[i].What == Updated {
			updated = &reports[i]
		}
	}
	mu.Unlock()
	if updated == nil || len(updated.Sites) != 3 || updated.Err != nil {
		t.Fatalf("reports %+v; want one Updated with 3 sites", reports)
	}
	now := cookies(w)
	counts, err := testprogs.ReadArray(c1.Counts, 64)
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 1} {
		name := testprogs.FuncName(i)
		want := uint64(testprogs.ExpectedCalls(i, calls))
		before, after := counts[old[name]]-first[old[name]], counts[now[name]]-first[now[name]]
		// The target calls its functions one after the other: the
		// first one's calls go on across the update.
		if i == 0 && (before == 0 || after == 0) && across {
			t.Errorf("%s (kept): %d calls counted before the update and %d after: the process did not call across it", name, before, after)
		}
		got := before + after
		switch {
		case got < want:
			t.Errorf("%s (kept): %d calls counted across the update, the process made %d", name, got, want)
		case got > want && updatable:
			t.Errorf("%s (kept): %d calls counted across an update with the generation check, the process made %d", name, got, want)
		case got > want:
			t.Logf("%s (kept): %d of %d calls counted twice while both links ran (no generation check)", name, got-want, want)
		}
	}
	t.Logf("%d calls of each function across the update", calls)

	// From here the new set counts, by the new program.
	var runs1, runs2 uint64
	c1.OutOfRange.Lookup(uint32(0), &runs1)
	c2.OutOfRange.Lookup(uint32(0), &runs2)
	runTarget(t, target, 1)
	after, err := testprogs.ReadArray(c1.Counts, 64)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		name := testprogs.FuncName(i)
		var want uint64
		if i != 2 && i != 4 {
			want = uint64(testprogs.ExpectedCalls(i, 1))
		}
		got := after[now[name]] - counts[now[name]]
		if i == 2 {
			got = after[old[name]] - counts[old[name]] // dropped
		}
		if got != want {
			t.Errorf("after the update, %s counted %d calls of a run, want %d", name, got, want)
		}
	}
	if program {
		var v1, v2 uint64
		c1.OutOfRange.Lookup(uint32(0), &v1)
		c2.OutOfRange.Lookup(uint32(0), &v2)
		if want := uint64(testprogs.ExpectedCalls(0, 1) + testprogs.ExpectedCalls(1, 1) + testprogs.ExpectedCalls(3, 1)); v1 != runs1 || v2-runs2 != want {
			t.Errorf("after the update, version 1 ran %d times and version 2 %d, want 0 and %d", v1-runs1, v2-runs2, want)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}

	// No probe of the next Watch has the pinned sites: detached.
	mu.Lock()
	reports = nil
	mu.Unlock()
	if w, err = New(probes("uprobe:/nonexistent/updated:func_00000"), spec2, c2.CountEntry, opts); err != nil {
		t.Fatal(err)
	}
	files := w.Files()
	mu.Lock()
	detached := len(reports) == 1 && reports[0].What == Detached
	mu.Unlock()
	if len(files) != 0 || !detached {
		t.Errorf("a Watch without the pinned probes: %d files, reports %+v; want the pinned link detached", len(files), reports)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(pins); len(ents) != 0 {
		t.Errorf("%d pins left after the pinned link was detached", len(ents))
	}
	before.Check(t, "after the last Close")
}

func itoa(n int) string { return strconv.Itoa(n) }

// runTarget runs a generated target making calls calls of each function.
func runTarget(t *testing.T, target string, calls int) {
	t.Helper()
	if out, err := exec.Command(target, itoa(calls)).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", target, err, out)
	}
}
