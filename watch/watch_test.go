package watch

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
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

// loadCounter loads the counter program from a spec prepared for plans
// with features f, as a watch's user does.
func loadCounter(t testing.TB, f kernelprobe.Features) (*ebpf.CollectionSpec, *testprogs.Counter) {
	t.Helper()
	spec, err := testprogs.CounterSpec()
	if err != nil {
		t.Fatal(err)
	}
	if err := multiprobe.PrepareSpec(spec, &multiprobe.Options{Features: &f}); err != nil {
		t.Fatal(err)
	}
	c, err := testprogs.NewCounter(spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return spec, c
}

// checkCounts fails t unless each of the n functions of a generated target
// was counted as often as times runs of it with calls make.
func checkCounts(t *testing.T, c *testprogs.Counter, n, calls, times int) {
	t.Helper()
	counts, err := testprogs.ReadArray(c.Counts, n)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if want := uint64(times * testprogs.ExpectedCalls(i, calls)); counts[i] != want {
			t.Errorf("%s: %d calls counted, want %d (%d runs)", testprogs.FuncName(i), counts[i], want, times)
		}
	}
}

// TestWatchContainers: processes that start after the watch, each running
// its own copy of a program from a mount namespace of its own (as
// containers of their own images would), are each attached once, before
// they make their calls, and every call is counted; a copy whose
// processes exited and that was deleted is detached.
func TestWatchContainers(t *testing.T) {
	eachPath(t, testWatchContainers)
}

// eachPath runs fn on the kernel's attach path and, where that is
// uprobe_multi, on the perf-event path too.
func eachPath(t *testing.T, fn func(*testing.T, kernelprobe.Features)) {
	t.Helper()
	requireEvents(t)
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

func testWatchContainers(t *testing.T, f kernelprobe.Features) {
	const n, copies, calls = 5, 6, 3
	// A name of its own: other tests' targets, exiting as this starts,
	// are called "target".
	target := filepath.Join(t.TempDir(), "watched"+strings.ReplaceAll(f.Path().String(), "_", ""))
	if err := os.Rename(testprogs.PrivateTarget(t, n), target); err != nil {
		t.Fatal(err)
	}
	spec, c := loadCounter(t, f)
	probes, err := multiprobe.ParseProbes("uprobe:" + filepath.Base(target) + ":func_*")
	if err != nil {
		t.Fatal(err)
	}
	before := probetest.TakeSnapshot(t)
	var mu sync.Mutex
	var reports []Report
	w, err := New(probes, spec, c.CountEntry, &Options{Plan: multiprobe.Options{Features: &f}, Report: func(r Report) {
		mu.Lock()
		reports = append(reports, r)
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	count := func(what What) int {
		mu.Lock()
		defer mu.Unlock()
		k := 0
		for _, r := range reports {
			if r.What == what {
				k++
			}
		}
		return k
	}
	waitFor := func(what What, k int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); count(what) < k; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				mu.Lock()
				t.Fatalf("%d %v reports, want %d: %+v", count(what), what, k, reports)
			}
		}
	}

	var procs []*testprogs.Proc
	var paths []string
	for range copies {
		p, inside := testprogs.StartInPrivateMount(t, target, "-wait", "3")
		procs, paths = append(procs, p), append(paths, inside)
	}
	waitFor(Attached, copies)
	if files := w.Files(); len(files) != copies {
		t.Errorf("%d files attached, want %d: %+v", len(files), copies, files)
	}
	for _, p := range procs {
		p.Finish(t)
	}
	checkCounts(t, c, n, calls, copies)

	// The copies are still there, so their uprobes wait for another
	// process; deleted, they go.
	if count(Detached) != 0 {
		t.Errorf("%d files detached while they still exist", count(Detached))
	}
	for _, inside := range paths {
		// StartInPrivateMount's copy lives in src beside mnt.
		if err := os.Remove(filepath.Join(filepath.Dir(filepath.Dir(inside)), "src", filepath.Base(inside))); err != nil {
			t.Fatal(err)
		}
	}
	exec.Command("true").Run() // an exit, which looks at idle files again
	waitFor(Detached, copies)
	if files := w.Files(); len(files) != 0 {
		t.Errorf("%d files attached after every copy was deleted", len(files))
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	before.Check(t, "after Close")
}

// TestWatchDlopen: a library that a running program opens with dlopen
// after the watch started is attached before the program calls it.
func TestWatchDlopen(t *testing.T) {
	requireEvents(t)
	py, err := exec.LookPath("python3")
	testutil.RequireTool(t, "python3", err)
	f, err := kernelprobe.Detect()
	if err != nil {
		t.Fatal(err)
	}
	spec, c := loadCounter(t, f)
	probes, err := multiprobe.ParseProbes("uprobe:libz:zlibVersion")
	if err != nil {
		t.Fatal(err)
	}
	w, err := New(probes, spec, c.CountEntry, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	// A python that loads no zlib until told (its zlib module would).
	p := testprogs.Start(t, py, "-S", "-c", `import sys, ctypes
print("ready", flush=True)
sys.stdin.readline()
z = ctypes.CDLL("libz.so.1")
print("opened", flush=True)
sys.stdin.readline()
for i in range(7):
    z.zlibVersion()
print("called", flush=True)`)
	if line := p.Do(t, "go"); line != "opened" {
		t.Fatalf("python said %q", line)
	}
	// Attached for this python, or for another process that maps the
	// same libz (the watch attaches a file once).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if files := w.Files(); len(files) == 1 && strings.Contains(files[0].Path, "libz.so") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("libz was not attached after dlopen: %+v", w.Files())
		}
	}
	if line := p.Do(t, "go"); line != "called" {
		t.Fatalf("python said %q", line)
	}
	counts, err := testprogs.ReadArray(c.Counts, 1)
	if err != nil {
		t.Fatal(err)
	}
	if counts[0] != 7 {
		t.Errorf("zlibVersion counted %d times, python called it 7 times", counts[0])
	}
}

// TestWatchBuilds: two builds under one glob (another number of
// functions, 5 and 20: another build ID) get cookie ranges of their own, and the
// second copy of a build shares its first's: each function is counted at
// its own cookie, as the Attached reports name them.
func TestWatchBuilds(t *testing.T) {
	requireEvents(t)
	f, err := kernelprobe.Detect()
	if err != nil {
		t.Fatal(err)
	}
	const calls = 3
	dir := t.TempDir()
	five, twenty := filepath.Join(dir, "build5"), filepath.Join(dir, "build20")
	if err := os.Rename(testprogs.PrivateTarget(t, 5), five); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(testprogs.PrivateTarget(t, 20), twenty); err != nil {
		t.Fatal(err)
	}
	fiveAgain := filepath.Join(dir, "build5-copy")
	if err := os.Rename(testprogs.PrivateCopy(t, five), fiveAgain); err != nil {
		t.Fatal(err)
	}
	spec, c := loadCounter(t, f)
	probes, err := multiprobe.ParseProbes("uprobe:" + dir + "/build*:func_*")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	sites := map[string][]multiprobe.Site{}
	w, err := New(probes, spec, c.CountEntry, &Options{Plan: multiprobe.Options{Features: &f, CookieBase: 10}, Report: func(r Report) {
		mu.Lock()
		defer mu.Unlock()
		if r.What == Attached {
			sites[r.Path] = r.Sites
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	var procs []*testprogs.Proc
	for _, p := range []string{five, twenty, fiveAgain} {
		procs = append(procs, testprogs.Start(t, p, "-wait", fmt.Sprint(calls)))
	}
	for deadline := time.Now().Add(10 * time.Second); len(w.Files()) < 3; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d files attached, want 3", len(w.Files()))
		}
	}
	for _, p := range procs {
		p.Finish(t)
	}
	mu.Lock()
	defer mu.Unlock()
	byCookie := map[uint64]string{}
	for path, ss := range sites {
		for _, s := range ss {
			if other, ok := byCookie[s.Cookie]; ok && other != s.Name {
				t.Errorf("cookie %d is %s and %s (%s)", s.Cookie, other, s.Name, path)
			}
			byCookie[s.Cookie] = s.Name
			if s.Cookie < 10 {
				t.Errorf("%s: cookie %d, below CookieBase 10", s.Name, s.Cookie)
			}
			if s.Probe.Target != dir+"/build*" {
				t.Errorf("%s: probe target %s, want the glob as given", s.Name, s.Probe.Target)
			}
		}
	}
	if len(byCookie) != 25 {
		t.Errorf("%d cookies, want 25 (5 for the build of five functions, twice, and 20): %v", len(byCookie), byCookie)
	}
	counts, err := testprogs.ReadArray(c.Counts, 10+25)
	if err != nil {
		t.Fatal(err)
	}
	for cookie, name := range byCookie {
		i, err := strconv.Atoi(strings.TrimPrefix(name, "func_"))
		if err != nil {
			t.Fatal(err)
		}
		want := uint64(testprogs.ExpectedCalls(i, calls))
		if len(sites[five]) > 0 && sites[five][0].Cookie <= cookie && cookie < sites[five][0].Cookie+5 {
			want *= 2 // both copies of the build
		}
		if counts[cookie] != want {
			t.Errorf("%s at cookie %d: %d calls, want %d", name, cookie, counts[cookie], want)
		}
	}
}

// TestWatchSeed: a file the target names here, which no process runs yet,
// is attached at New, so that a program that runs it later, however
// briefly, has every call counted; a path through a symbolic link means
// the file it leads to.
func TestWatchSeed(t *testing.T) {
	requireEvents(t)
	f, err := kernelprobe.Detect()
	if err != nil {
		t.Fatal(err)
	}
	const n, calls = 5, 3
	target := testprogs.PrivateTarget(t, n)
	link := filepath.Join(t.TempDir(), "seeded")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	spec, c := loadCounter(t, f)
	probes, err := multiprobe.ParseProbes("uprobe:" + link + ":func_*")
	if err != nil {
		t.Fatal(err)
	}
	w, err := New(probes, spec, c.CountEntry, &Options{Plan: multiprobe.Options{Features: &f}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if files := w.Files(); len(files) != 1 || files[0].Path != target {
		t.Fatalf("attached at New: %+v, want %s", files, target)
	}
	if out, err := exec.Command(link, fmt.Sprint(calls)).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", link, err, out)
	}
	checkCounts(t, c, n, calls, 1)
}

// TestWatchPIDs: Options.Plan.PIDs filters every file's link: of two
// processes running one file, only the one named is counted, on both
// paths.
func TestWatchPIDs(t *testing.T) {
	eachPath(t, func(t *testing.T, f kernelprobe.Features) {
		const n, calls = 5, 3
		target := filepath.Join(t.TempDir(), "filtered")
		if err := os.Rename(testprogs.PrivateTarget(t, n), target); err != nil {
			t.Fatal(err)
		}
		spec, c := loadCounter(t, f)
		probes, err := multiprobe.ParseProbes("uprobe:filtered:func_*")
		if err != nil {
			t.Fatal(err)
		}
		in := testprogs.Start(t, target, "-wait", fmt.Sprint(calls))
		out := testprogs.Start(t, target, "-wait", fmt.Sprint(calls))
		opts := multiprobe.Options{Features: &f, PIDs: []int{in.PID()}}
		if err := multiprobe.PrepareSpec(spec, &opts); err != nil {
			t.Fatal(err)
		}
		w, err := New(probes, spec, c.CountEntry, &Options{Plan: opts})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		if files := w.Files(); len(files) != 1 || files[0].Users != 2 {
			t.Fatalf("files %+v, want one with two users", files)
		}
		in.Finish(t)
		out.Finish(t)
		checkCounts(t, c, n, calls, 1)
	})
}
