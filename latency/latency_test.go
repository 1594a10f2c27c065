package latency_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/count"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/latency"
	"github.com/multiprobe/multiprobe/probetest"
	"github.com/multiprobe/multiprobe/watch"
)

// sleeperWant is what the sleeper target's functions take, each called n
// times a run: the slot (2^slot ns) most calls fall in, -1 for under 1 ms.
func sleeperWant(n int) map[string]struct {
	calls uint64
	slot  int
} {
	return map[string]struct {
		calls uint64
		slot  int
	}{
		"nap_3ms":    {uint64(n), 21},
		"nap_12ms":   {uint64(n), 23},
		"no_nap":     {uint64(n), -1},
		"nap_nested": {uint64(3 * n), 21}, // recursion: three frames in flight
	}
}

// checkSleeper checks the histograms of a run of the sleeper target: every
// call timed once, most in the slot of its sleep or the next, none below.
func checkSleeper(t *testing.T, fns []latency.Function, n, runs int) {
	t.Helper()
	want := sleeperWant(n)
	if len(fns) != len(want) {
		t.Errorf("%d functions timed, want %d", len(fns), len(want))
	}
	for _, f := range fns {
		w, ok := want[f.Site.Name]
		if !ok {
			t.Errorf("unexpected function %s", f.Site.Name)
			continue
		}
		var sum, below, near uint64
		for i, c := range f.Slots {
			sum += c
			switch {
			case w.slot < 0:
				if i < 20 {
					near += c
				}
			case i < w.slot:
				below += c
			case i <= w.slot+1:
				near += c
			}
		}
		calls := uint64(runs) * w.calls
		if f.Count != calls || sum != calls {
			t.Errorf("%s: %d calls, %d in the slots; want %d", f.Site.Name, f.Count, sum, calls)
		}
		// A sleep is a floor; a busy (or emulated) machine makes some
		// calls slower, into the next slot now and then.
		if below > 0 || near*4 < calls*3 {
			t.Errorf("%s: %d calls below slot %d, %d of %d in it or the next: %v", f.Site.Name, below, w.slot, near, calls, f.Slots)
		}
	}
}

// TestTimer times the sleeper target's functions, which take known times,
// with sessions where the kernel has them and with entry and return pairs
// on both attach paths (and on the perf-event path without cookies), by
// function and by process.
func TestTimer(t *testing.T) {
	probetest.RequireBPF(t)
	target := testprogs.SleeperTarget(t)
	const n = 6
	f, err := kernelprobe.Detect()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		force string
		by    count.By
	}{{"", count.BySite}, {"nosession", count.ByProcess}, {"fallback", count.BySite}, {"nocookie", count.ByCgroup}} {
		t.Run(tc.force+"/"+tc.by.String(), func(t *testing.T) {
			t.Setenv(kernelprobe.ForceEnv, tc.force)
			probes, err := multiprobe.ParseProbes("uprobe:" + target + ":nap_*,no_nap")
			if err != nil {
				t.Fatal(err)
			}
			before := probetest.TakeSnapshot(t)
			plan, err := latency.Resolve(probes, nil)
			if err != nil {
				t.Fatal(err)
			}
			if session := tc.force == "" && f.Path() == kernelprobe.PathUprobeMulti && f.UprobeSession; plan.Session != session {
				t.Errorf("Session %v, want %v", plan.Session, session)
			}
			tm, err := latency.Attach(plan, &latency.Options{By: tc.by})
			if err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(target, fmt.Sprint(n))
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", target, err, out)
			}
			snap, err := tm.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			checkSleeper(t, snap.Functions, n, 1)
			if snap.Unmatched != 0 {
				t.Errorf("%d unmatched returns, want 0", snap.Unmatched)
			}
			if tc.by != count.BySite {
				var calls uint64
				for _, b := range snap.By {
					calls += b.Count
					if tc.by == count.ByProcess && b.Who != uint64(cmd.Process.Pid) {
						t.Errorf("calls timed for pid %d, the target was %d", b.Who, cmd.Process.Pid)
					}
				}
				if want := uint64(6 * n); calls != want || snap.Unattributed != 0 {
					t.Errorf("by %v: %d calls, %d unattributed; want %d, 0", tc.by, calls, snap.Unattributed, want)
				}
			}
			if err := tm.Close(); err != nil {
				t.Fatal(err)
			}
			tm.Close()
			plan.Close()
			before.Check(t, "after Close")
		})
	}
}

// TestTimerWatch times the sleeper under package watch: the pairs, the
// sites filled in before they are attached (Options.Resolved), one
// Function per function over the run.
func TestTimerWatch(t *testing.T) {
	probetest.RequireBPF(t)
	// The watch switches a static key of the system call path: see
	// SkipOnMTTCG (package watch's own tests run in the guests).
	testutil.SkipOnMTTCG(t)
	target := filepath.Join(t.TempDir(), "sleeper")
	data, err := os.ReadFile(testprogs.SleeperTarget(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(target, data, 0o755); err != nil {
		t.Fatal(err)
	}
	const n = 4
	probes, err := multiprobe.ParseProbes("uprobe:" + target + ":nap_*,no_nap")
	if err != nil {
		t.Fatal(err)
	}
	tm, err := latency.NewForWatch(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tm.Close()
	w, err := watch.New(latency.Pairs(probes), tm.Spec(), tm.Program(), &watch.Options{Resolved: tm.Fill})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for range 2 {
		if out, err := exec.Command(target, fmt.Sprint(n)).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", target, err, out)
		}
	}
	snap, err := tm.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	checkSleeper(t, snap.Functions, n, 2)
}

// TestResolveErrors: only entry probes are functions to time.
func TestResolveErrors(t *testing.T) {
	probes, err := multiprobe.ParseProbes("uretprobe:/bin/true:main")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := latency.Resolve(probes, nil); err == nil {
		t.Error("a uretprobe: no error")
	}
	if _, err := latency.New(nil, nil); err == nil {
		t.Error("nil plan: no error")
	}
}
