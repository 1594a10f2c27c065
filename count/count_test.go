package count_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/count"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/probetest"
	"github.com/multiprobe/multiprobe/watch"
)

// eachPath runs fn on the kernel's attach path and, where that is
// uprobe_multi, on the perf-event path too.
func eachPath(t *testing.T, fn func(*testing.T, kernelprobe.Features)) {
	t.Helper()
	probetest.RequireBPF(t)
	native, err := kernelprobe.Detect()
	if err != nil {
		t.Fatal(err)
	}
	perf := native
	perf.UprobeMulti, perf.UprobeMultiPIDFilter, perf.UprobeSession = false, false, false
	for _, f := range []kernelprobe.Features{native, perf} {
		t.Run(f.Path().String(), func(t *testing.T) { fn(t, f) })
		if native.Path() == kernelprobe.PathPerfEvent {
			break
		}
	}
}

func resolve(t *testing.T, f kernelprobe.Features, opts multiprobe.Options, specs ...string) *multiprobe.Plan {
	t.Helper()
	probes, err := multiprobe.ParseProbes(strings.Join(specs, " "))
	if err != nil {
		t.Fatal(err)
	}
	opts.Features = &f
	plan, err := multiprobe.Resolve(probes, &opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { plan.Close() })
	return plan
}

// cgroupID is the cgroup v2 id of this process's cgroup, which its
// children start in: the inode of its directory.
func cgroupID(t *testing.T) uint64 {
	t.Helper()
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	var path string
	for _, line := range strings.Split(string(data), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			path = p
		}
	}
	for _, root := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		var fs syscall.Statfs_t
		if syscall.Statfs(root, &fs) != nil || fs.Type != 0x63677270 { // CGROUP2_SUPER_MAGIC
			continue
		}
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(root, path), &st); err != nil {
			t.Fatal(err)
		}
		return st.Ino
	}
	t.Skip("no cgroup v2 hierarchy")
	return 0
}

// TestCount: a target calls each of its functions a known number of
// times; the counts by site are exact, on both paths, with and without
// cookies' help (the perf-event path before 5.15 gives each site a copy),
// with a pid filter, and by process and by cgroup the calls are all the
// target's, in its cgroup.
func TestCount(t *testing.T) {
	eachPath(t, func(t *testing.T, f kernelprobe.Features) {
		for _, tc := range []struct {
			by   count.By
			pids bool
		}{{count.BySite, false}, {count.BySite, true}, {count.ByProcess, false}, {count.ByCgroup, true}} {
			t.Run(fmt.Sprintf("%v,pids=%v", tc.by, tc.pids), func(t *testing.T) {
				const n, calls = 5, 1000
				target := testprogs.PrivateTarget(t, n)
				before := probetest.TakeSnapshot(t)
				p := testprogs.Start(t, target, "-wait", fmt.Sprint(calls))
				var opts multiprobe.Options
				if tc.pids {
					opts.PIDs = []int{p.PID()}
				}
				plan := resolve(t, f, opts, "uprobe:"+target+":func_*")
				c, err := count.Attach(plan, &count.Options{By: tc.by})
				if err != nil {
					t.Fatal(err)
				}
				// Another run, not in the pid set: counted only without one.
				runs := 2
				if tc.pids {
					runs = 1
				}
				p.Finish(t)
				other := testprogs.Start(t, target, "-wait", fmt.Sprint(calls))
				other.Finish(t)
				snap, err := c.Snapshot()
				if err != nil {
					t.Fatal(err)
				}
				var total uint64
				for _, s := range snap.Sites {
					var i int
					fmt.Sscanf(s.Site.Name, "func_%05d", &i)
					want := uint64(runs * testprogs.ExpectedCalls(i, calls))
					total += want
					if s.Calls != want {
						t.Errorf("%s: %d calls counted, want %d", s.Site.Name, s.Calls, want)
					}
				}
				if len(snap.Sites) != n || snap.Calls != total {
					t.Errorf("%d sites, %d calls in all; want %d, %d", len(snap.Sites), snap.Calls, n, total)
				}
				switch tc.by {
				case count.BySite:
					if len(snap.By) != 0 {
						t.Errorf("BySite: %d counts by who", len(snap.By))
					}
				case count.ByProcess:
					var mine uint64
					for _, b := range snap.By {
						if b.Who == uint64(p.PID()) {
							mine += b.Calls
						}
					}
					if want := total / 2; mine != want || snap.Unattributed != 0 {
						t.Errorf("ByProcess: %d calls by the first run (pid %d), %d unattributed; want %d, 0: %+v", mine, p.PID(), snap.Unattributed, want, snap.By)
					}
				case count.ByCgroup:
					id := cgroupID(t)
					if len(snap.By) != n || snap.By[0].Who != id || snap.Unattributed != 0 {
						t.Errorf("ByCgroup: %+v, %d unattributed; want %d counts, all by cgroup %d", snap.By, snap.Unattributed, n, id)
					}
				}
				if err := c.Close(); err != nil {
					t.Fatal(err)
				}
				c.Close() // again: nothing
				plan.Close()
				before.Check(t, "after Close")
			})
		}
	})
}

// TestCountMaxBy: past MaxBy pairs a call is counted by its site only,
// and the Snapshot says how many calls are not attributed.
func TestCountMaxBy(t *testing.T) {
	probetest.RequireBPF(t)
	f, err := kernelprobe.Detect()
	if err != nil {
		t.Fatal(err)
	}
	const n, calls = 5, 100
	target := testprogs.PrivateTarget(t, n)
	plan := resolve(t, f, multiprobe.Options{}, "uprobe:"+target+":func_*")
	c, err := count.Attach(plan, &count.Options{By: count.ByProcess, MaxBy: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	testprogs.Start(t, target, "-wait", fmt.Sprint(calls)).Finish(t)
	snap, err := c.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var credited uint64
	for _, b := range snap.By {
		credited += b.Calls
	}
	if len(snap.By) != 2 || credited+snap.Unattributed != snap.Calls || snap.Unattributed == 0 {
		t.Errorf("MaxBy 2: %d counts by who, %d credited, %d unattributed, %d in all", len(snap.By), credited, snap.Unattributed, snap.Calls)
	}
}

// TestCountWatch: the counter under package watch, every process's copy
// of a target: Read counts the sites the watch's files report, exactly.
func TestCountWatch(t *testing.T) {
	probetest.RequireBPF(t)
	// The watch switches a static key of the system call path: see
	// SkipOnMTTCG (package watch's own tests run in the guests).
	testutil.SkipOnMTTCG(t)
	const n, calls = 5, 300
	target := filepath.Join(t.TempDir(), "counted")
	if err := os.Rename(testprogs.PrivateTarget(t, n), target); err != nil {
		t.Fatal(err)
	}
	probes, err := multiprobe.ParseProbes("uprobe:" + target + ":func_*") // a path: attached at New
	if err != nil {
		t.Fatal(err)
	}
	c, err := count.NewForWatch(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	w, err := watch.New(probes, c.Spec(), c.Program(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for range 2 {
		testprogs.Start(t, target, "-wait", fmt.Sprint(calls)).Finish(t)
	}
	files := w.Files()
	if len(files) != 1 {
		t.Fatalf("%d files attached, want 1", len(files))
	}
	snap, err := c.Read(files[0].Link.Sites())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range snap.Sites {
		var i int
		fmt.Sscanf(s.Site.Name, "func_%05d", &i)
		if want := uint64(2 * testprogs.ExpectedCalls(i, calls)); s.Calls != want {
			t.Errorf("%s: %d calls counted under the watch, want %d", s.Site.Name, s.Calls, want)
		}
	}
	bad := files[0].Link.Sites()[:1]
	bad[0].Cookie = count.DefaultWatchCookies
	if _, err := c.Read(bad); !errors.Is(err, count.ErrCookie) {
		t.Errorf("Read of a cookie past the room: %v, want ErrCookie", err)
	}
}

// TestCountErrors: bad options are errors, before anything is loaded.
func TestCountErrors(t *testing.T) {
	if _, err := count.NewForWatch(nil, &count.Options{By: 7}); err == nil {
		t.Error("By 7: no error")
	}
	if _, err := count.New(nil, nil); err == nil {
		t.Error("nil plan: no error")
	}
}
