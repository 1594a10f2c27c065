package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/probetest"
)

// latencyJSON runs latency --json with args and decodes its report.
func latencyJSON(t *testing.T, args ...string) latencyReport {
	t.Helper()
	out, errOut, code := execCLI(t, append([]string{"latency", "--json"}, args...)...)
	if code != 0 {
		t.Fatalf("latency %q: exit %d: %s", args, code, errOut)
	}
	var r latencyReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return r
}

// TestLatency times the functions of a target that sleep known times, on
// each attach path, and checks that every call is timed once and that each
// function's histogram has its mass in the slot of its sleep.
func TestLatency(t *testing.T) {
	probetest.RequireBPF(t)
	target := testprogs.SleeperTarget(t)
	const n = 6
	// slot -1: everything below 1 ms (2^20 ns).
	want := map[string]struct {
		calls uint64
		slot  int
	}{
		"nap_3ms":    {n, 21},
		"nap_12ms":   {n, 23},
		"no_nap":     {n, -1},
		"nap_nested": {3 * n, 21}, // recursion: three frames in flight
	}
	f, err := kernelprobe.Detect()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ force, mode string }{
		{"", "session"},
		{"nosession", "pairs"},
		{"fallback", "pairs"},
		{"nocookie", "pairs"},
	} {
		t.Run(tc.mode+"/"+tc.force, func(t *testing.T) {
			t.Setenv(kernelprobe.ForceEnv, tc.force)
			mode := tc.mode
			if tc.force == "" && (f.Path() != kernelprobe.PathUprobeMulti || !f.UprobeSession) {
				mode = "pairs"
			}
			r := latencyJSON(t, "uprobe:"+target+":nap_*,no_nap", "--", target, fmt.Sprint(n))
			if r.Mode != mode || r.Functions != len(want) || r.Called != len(want) || r.Unmatched != 0 {
				t.Errorf("mode %s, %d of %d functions called, %d unmatched; want %s, %d of %d, 0",
					r.Mode, r.Called, r.Functions, r.Unmatched, mode, len(want), len(want))
			}
			for _, l := range r.Latencies {
				w, ok := want[l.Function]
				if !ok {
					t.Errorf("unexpected function %s", l.Function)
					continue
				}
				// A spin is a floor: no call can be faster. A busy
				// machine (or an emulated one: the arm64 guest runs under
				// TCG) can make one slower, into the next slot now and
				// then, but not most of them further.
				var sum, below, near uint64
				for _, b := range l.Buckets {
					sum += b.Count
					switch {
					case w.slot < 0:
						if b.HighNS != 0 && b.HighNS <= 1<<20 {
							near += b.Count
						}
					case b.LowNS < 1<<w.slot:
						below += b.Count
					case b.LowNS <= 1<<(w.slot+1):
						near += b.Count
					}
				}
				if l.Calls != w.calls || sum != w.calls {
					t.Errorf("%s: %d calls, %d in the buckets; want %d", l.Function, l.Calls, sum, w.calls)
				}
				if below > 0 || near*4 < w.calls*3 {
					t.Errorf("%s: %d calls below slot %d, %d of %d in it or the next: %+v", l.Function, below, w.slot, near, w.calls, l.Buckets)
				}
			}
		})
	}
}

// TestLatencyGo times the Go target's functions, whose returns are probed
// at their return instructions: Deep recurses on goroutine stacks that grow
// (and move) while its frames are in flight, Pair returns from two places,
// Panicky's panicking calls never return.
func TestLatencyGo(t *testing.T) {
	probetest.RequireBPF(t)
	testutil.SkipOnMTTCG(t)
	target := testprogs.GoTarget(t, false)
	const goroutines, depth, n = 3, 300, 20
	r := latencyJSON(t, "uprobe:"+target+":main.Deep,main.Pair,main.Leaf,main.Panicky", "--", target, fmt.Sprint(goroutines), fmt.Sprint(depth), fmt.Sprint(n))
	if r.Mode != "pairs" || r.Unmatched != 0 {
		t.Errorf("mode %s, %d unmatched; want pairs, 0", r.Mode, r.Unmatched)
	}
	want := map[string]uint64{
		"main.Deep":    goroutines * (depth + 1),
		"main.Pair":    n,
		"main.Leaf":    n,
		"main.Panicky": n - n/10,
	}
	got := map[string]uint64{}
	for _, l := range r.Latencies {
		got[l.Function] = l.Calls
	}
	for fn, calls := range want {
		if got[fn] != calls {
			t.Errorf("%s: %d calls timed, want %d", fn, got[fn], calls)
		}
	}
}

// TestLatencyText checks the drawn histograms and the usage errors.
func TestLatencyText(t *testing.T) {
	probetest.RequireBPF(t)
	target := testprogs.SleeperTarget(t)
	out, errOut, code := execCLI(t, "latency", "--top", "1", "uprobe:"+target+":nap_3ms,nap_12ms", "--", target, "2")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, s := range []string{
		"nap_12ms  2 calls, avg ",
		"TIME  COUNT  DISTRIBUTION\n",
		"[  8.39ms, 16.8ms)",
		"|****************************************|\n",
		"(1 more function called, left out by --top)\n",
		"2 of 2 functions called in ",
	} {
		if !strings.Contains(out, s) {
			t.Errorf("output lacks %q:\n%s", s, out)
		}
	}
	if strings.Contains(out, "nap_3ms") {
		t.Errorf("--top 1 printed nap_3ms:\n%s", out)
	}
	for _, args := range [][]string{
		{"uretprobe:" + target + ":nap_3ms"},
		{"usdt:" + target + ":a:b"},
		{},
		{"--top", "-1", "uprobe:" + target + ":nap_3ms"},
	} {
		if _, errOut, code := execCLI(t, append([]string{"latency"}, args...)...); code != 2 {
			t.Errorf("latency %q: exit %d, want 2: %s", args, code, errOut)
		}
	}
}

// TestMedianNS checks the median a histogram gives, which says whether a
// function's time is mostly the probes' own: one slow call among fast ones
// (as the first call of a process is) leaves it where the fast ones are.
func TestMedianNS(t *testing.T) {
	for _, tc := range []struct {
		name    string
		f       latencyFunction
		atLeast uint64
		below   uint64
	}{
		{"no calls", latencyFunction{}, 0, 1},
		{"one call", latencyFunction{Calls: 1, Buckets: []latencyBucket{{1024, 2048, 1}}}, 1024, 2048},
		{"a slow first call", latencyFunction{Calls: 5, AvgNS: 286000, Buckets: []latencyBucket{
			{16384, 32768, 3}, {32768, 65536, 0}, {65536, 131072, 0}, {131072, 262144, 1},
			{262144, 524288, 0}, {524288, 1048576, 0}, {1048576, 2097152, 1},
		}}, 16384, 32768},
		{"the middle of two buckets", latencyFunction{Calls: 4, Buckets: []latencyBucket{{100, 200, 2}, {200, 400, 2}}}, 100, 200},
		{"an open last bucket", latencyFunction{Calls: 3, Buckets: []latencyBucket{{100, 200, 1}, {1 << 40, 0, 2}}}, 1 << 40, 1<<40 + 1},
	} {
		if got := tc.f.medianNS(); got < tc.atLeast || got >= tc.below {
			t.Errorf("%s: median %d, want in [%d, %d)", tc.name, got, tc.atLeast, tc.below)
		}
	}
}
