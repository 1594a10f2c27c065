package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/probetest"
)

// startCLI starts the CLI (this test binary, as execCLI runs it) with args
// and returns it, what it prints on stdout, once it has exited, and its
// stderr as it comes. It is killed when the test ends.
func startCLI(t *testing.T, args ...string) (*exec.Cmd, *strings.Builder, io.Reader) {
	t.Helper()
	cmd := cliCommand(t, args...)
	out := &strings.Builder{}
	cmd.Stdout = out
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd, out, stderr
}

// TestCountFollow: count with no command and no --pid follows every
// process: copies of a program that start after it, each from a mount
// namespace of its own, are attached as they appear (a line each with
// --verbose), and their calls add up in one row per function.
func TestCountFollow(t *testing.T) {
	probetest.RequireBPF(t)
	// A watch attaches raw tracepoints on sys_enter and sys_exit.
	testutil.SkipOnMTTCG(t)
	const n, copies, calls = 5, 3, 2
	dir := t.TempDir()
	target := filepath.Join(dir, "followed")
	if err := os.Rename(testprogs.PrivateTarget(t, n), target); err != nil {
		t.Fatal(err)
	}
	cmd, out, stderr := startCLI(t, "count", "--json", "-v", "--duration", "60", "uprobe:followed:func_*")
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	// The copies wait to be told to call: whether they start before the
	// watch (its scan finds them) or after (its events do), they are
	// attached first.
	var procs []*testprogs.Proc
	for range copies {
		p, _ := testprogs.StartInPrivateMount(t, target, "-wait", fmt.Sprint(calls))
		procs = append(procs, p)
	}
	var said []string
	for attached := 0; attached < copies; {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("count ended; it said:\n%s", strings.Join(said, "\n"))
			}
			said = append(said, l)
			if strings.HasPrefix(l, "attached ") && strings.Contains(l, "/followed (process ") {
				attached++
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("%d of %d copies attached; count said:\n%s", attached, copies, strings.Join(said, "\n"))
		}
	}
	for _, p := range procs {
		p.Finish(t)
	}
	cmd.Process.Signal(os.Interrupt)
	for l := range lines {
		said = append(said, l)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("count after SIGINT: %v, want exit status 0 (Ctrl-C is how a follow run ends)", err)
	}
	var r countReport
	if err := json.Unmarshal([]byte(out.String()), &r); err != nil {
		t.Fatalf("%v\n%s\n%s", err, out.String(), strings.Join(said, "\n"))
	}
	if len(r.Files) != copies {
		t.Errorf("report names %d files, want %d: %v", len(r.Files), copies, r.Files)
	}
	for i := range n {
		want := uint64(copies * testprogs.ExpectedCalls(i, calls))
		var got uint64
		rows := 0
		for _, c := range r.Counts {
			if c.Function == testprogs.FuncName(i) {
				got, rows = got+c.Calls, rows+1
			}
		}
		if got != want || rows != 1 {
			t.Errorf("%s: %d calls in %d rows, want %d in one", testprogs.FuncName(i), got, rows, want)
		}
	}
}

// TestMergeRows: rows of one kind and function from several builds are one
// row, their calls and sites added up, the path kept only where it is one.
func TestMergeRows(t *testing.T) {
	got := mergeRows([]countedSite{
		{Kind: "uprobe", Function: "malloc", Path: "/a/libc.so.6", Calls: 3, Sites: 1},
		{Kind: "uprobe", Function: "free", Path: "/a/libc.so.6", Calls: 4, Sites: 1},
		{Kind: "uprobe", Function: "malloc", Path: "/b/libc.so.6", Calls: 2, Sites: 1},
		{Kind: "uretprobe", Function: "malloc", Path: "/a/libc.so.6", Calls: 1, Sites: 1},
	}, byNone)
	want := []countedSite{
		{Kind: "uprobe", Function: "malloc", Path: "", Calls: 5, Sites: 2},
		{Kind: "uprobe", Function: "free", Path: "/a/libc.so.6", Calls: 4, Sites: 1},
		{Kind: "uretprobe", Function: "malloc", Path: "/a/libc.so.6", Calls: 1, Sites: 1},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("mergeRows = %+v, want %+v", got, want)
	}
}

// TestLatencyFollow: latency with no command and no --pid times a program
// started after it, whose file it attached at once (a path named here):
// nap_3ms and nap_12ms, three calls each, in their slots.
func TestLatencyFollow(t *testing.T) {
	probetest.RequireBPF(t)
	// A watch attaches raw tracepoints on sys_enter and sys_exit.
	testutil.SkipOnMTTCG(t)
	dir := t.TempDir()
	napper := filepath.Join(dir, "napper")
	data, err := os.ReadFile(testprogs.SleeperTarget(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(napper, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd, out, stderr := startCLI(t, "latency", "--json", "-v", "--duration", "60", "uprobe:"+napper+":nap_3ms,nap_12ms")
	sc := bufio.NewScanner(stderr)
	for sc.Scan() && !strings.HasPrefix(sc.Text(), "attached "+napper) {
	}
	if o, err := exec.Command(napper, "3").CombinedOutput(); err != nil {
		t.Fatalf("%s 3: %v\n%s", napper, err, o)
	}
	cmd.Process.Signal(os.Interrupt)
	for sc.Scan() {
	}
	cmd.Wait()
	var r latencyReport
	if err := json.Unmarshal([]byte(out.String()), &r); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []struct {
		fn   string
		slot int
	}{{"nap_3ms", 21}, {"nap_12ms", 23}} {
		found := false
		for _, l := range r.Latencies {
			if l.Function != want.fn {
				continue
			}
			found = true
			var inSlot uint64
			for _, b := range l.Buckets {
				if b.LowNS == 1<<want.slot {
					inSlot = b.Count
				}
			}
			if l.Calls != 3 || inSlot < 2 {
				t.Errorf("%s: %d calls, %d in [2^%d, 2^%d) ns, want 3 calls, 2 or more there (a spin can be preempted): %+v", want.fn, l.Calls, inSlot, want.slot, want.slot+1, l.Buckets)
			}
		}
		if !found {
			t.Errorf("%s not timed: %s", want.fn, out.String())
		}
	}
	if len(r.Files) != 1 {
		t.Errorf("files %v, want the one", r.Files)
	}
}

// TestCountFollowFiles: --json of a follow run has one files entry a
// file however many processes run it: 100 short-lived runs of one file
// are one entry (with the processes the watch saw: one that exits within
// microseconds may be gone before it reads its maps, half of them on a
// busy machine); the file replaced (a new inode at the
// same path, as an upgrade does) and its old one deleted is a second
// entry, and the first says when it was detached. The probes are the
// specs as given, each once, and the counts are the runs'.
func TestCountFollowFiles(t *testing.T) {
	probetest.RequireBPF(t)
	testutil.SkipOnMTTCG(t)
	const n, calls, runs = 5, 1, 100
	target := filepath.Join(t.TempDir(), "churn")
	if err := os.Rename(testprogs.PrivateTarget(t, n), target); err != nil {
		t.Fatal(err)
	}
	cmd, out, stderr := startCLI(t, "count", "--json", "-v", "--duration", "60", "uprobe:"+target+":func_*")
	lines := make(chan string, 1000)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	// heard are the lines count said; count is how many start with a
	// prefix. Waiting for one line never loses another.
	var heard []string
	count := func(prefix string) int {
		n := 0
		for _, l := range heard {
			if strings.HasPrefix(l, prefix) {
				n++
			}
		}
		return n
	}
	said := func(prefix string, times int, within time.Duration) bool {
		t.Helper()
		deadline := time.After(within)
		for count(prefix) < times {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("count ended before saying %q", prefix)
				}
				heard = append(heard, l)
			case <-deadline:
				return false
			}
		}
		return true
	}
	await := func(prefix string, times int) {
		t.Helper()
		if !said(prefix, times, 20*time.Second) {
			t.Fatalf("count did not say %q %d times; it said:\n%s", prefix, times, strings.Join(heard, "\n"))
		}
	}
	await("attached "+target, 1)
	for range runs {
		if o, err := exec.Command(target, fmt.Sprint(calls)).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", target, err, o)
		}
	}
	// An upgrade: the new file renamed over the old, which goes once no
	// process runs it.
	next := target + ".new"
	data, err := os.ReadFile(target)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(next, data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(next, target); err != nil {
		t.Fatal(err)
	}
	// An exec of the new file maps it, and the watch attaches it then,
	// if the process is still there when the watch reads its maps (one
	// that exits within microseconds may not be): runs until it is, then
	// one more, counted whole. An exit lets the watch see the old file
	// unlinked and idle.
	newRuns := 0
	for attached := false; !attached; newRuns++ {
		if newRuns == 100 {
			t.Fatal("the new file was not attached in 100 runs")
		}
		if o, err := exec.Command(target, fmt.Sprint(calls)).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", target, err, o)
		}
		attached = said("attached "+target, 2, 200*time.Millisecond)
	}
	if o, err := exec.Command(target, fmt.Sprint(calls)).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", target, err, o)
	}
	await("detached "+target, 1)
	cmd.Process.Signal(os.Interrupt)
	for range lines {
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("count: %v", err)
	}
	var r countReport
	if err := json.Unmarshal([]byte(out.String()), &r); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if len(r.Probes) != 1 || r.Probes[0] != "uprobe:"+target+":func_*" {
		t.Errorf("probes %q, want the one spec as given", r.Probes)
	}
	if len(r.Files) != 2 {
		t.Fatalf("files %+v, want the file and its replacement", r.Files)
	}
	old, cur := r.Files[0], r.Files[1]
	if old.Inode == cur.Inode || old.Path != target || cur.Path != target || old.Detached == nil || cur.Detached != nil ||
		old.Processes < 1 || old.Processes > runs+1 || old.Sites != n || cur.Sites != n || old.BuildID == "" || old.BuildID != cur.BuildID {
		t.Errorf("files %+v, %+v: want %s twice, two inodes, the first detached and run %d times, %d sites each, one build", old, cur, target, runs, n)
	}
	// Every call into the old file, attached from the start, counts; the
	// new one is attached a moment after a mapping, which may miss the
	// runs until then, not the one after.
	for i := range n {
		e := uint64(testprogs.ExpectedCalls(i, calls))
		low, high := uint64(runs+1)*e, uint64(runs+newRuns+1)*e
		for _, c := range r.Counts {
			if c.Function == testprogs.FuncName(i) && (c.Calls < low || c.Calls > high) {
				t.Errorf("%s: %d calls, want %d to %d", c.Function, c.Calls, low, high)
			}
		}
	}
}
