package multiprobe_test

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/attach"
	"github.com/multiprobe/multiprobe/elfsym"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/probetest"
	"github.com/multiprobe/multiprobe/usdt"
)

// paths returns the attach paths to test on this kernel: its own, checked
// against the path the run expects (MULTIPROBE_EXPECT_PATH), and, where
// that is uprobe_multi, the per-site fallback forced.
func paths(t *testing.T) []kernelprobe.Features {
	t.Helper()
	probetest.RequireBPF(t)
	native, forced := nativeAndPerfEvent(t)
	testutil.ExpectPath(t, native.Path().String())
	out := []kernelprobe.Features{native}
	if native.Path() == kernelprobe.PathUprobeMulti {
		out = append(out, forced)
	}
	return out
}

// forEachPath runs fn as a subtest on every path paths returns.
func forEachPath(t *testing.T, fn func(t *testing.T, f kernelprobe.Features)) {
	for _, f := range paths(t) {
		t.Run(f.Path().String(), func(t *testing.T) { fn(t, f) })
	}
}

// setup resolves each group of specs into a plan with opts on the path of
// f, prepares the counter's spec for every plan, and loads it as a bpf2go
// user does (LoadAndAssign into the generated struct).
func setup(t *testing.T, f kernelprobe.Features, opts multiprobe.Options, groups ...[]string) (*testprogs.Counter, []*multiprobe.Plan) {
	t.Helper()
	each := make([]multiprobe.Options, len(groups))
	for i := range each {
		each[i] = opts
	}
	return setupEach(t, f, each, groups...)
}

// setupEach is setup with options of their own for each group of specs.
func setupEach(t *testing.T, f kernelprobe.Features, opts []multiprobe.Options, groups ...[]string) (*testprogs.Counter, []*multiprobe.Plan) {
	t.Helper()
	spec, err := testprogs.CounterSpec()
	if err != nil {
		t.Fatal(err)
	}
	plans := make([]*multiprobe.Plan, len(groups))
	for i, g := range groups {
		o := opts[i]
		o.Features = &f
		pl, err := multiprobe.Resolve(mustParse(t, g...), &o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pl.Close() })
		if err := pl.Prepare(spec); err != nil {
			t.Fatal(err)
		}
		plans[i] = pl
	}
	c, err := testprogs.NewCounter(spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, plans
}

// mustAttach attaches prog to pl's sites, detaching at the end of the test.
func mustAttach(t *testing.T, pl *multiprobe.Plan, prog *ebpf.Program) *multiprobe.Link {
	t.Helper()
	l, err := pl.Attach(prog)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// checkPath fails t if l did not take the path of f.
func checkPath(t *testing.T, l *multiprobe.Link, f kernelprobe.Features) {
	t.Helper()
	if l.AttachPath() != f.Path() {
		t.Errorf("attached through %v, want %v", l.AttachPath(), f.Path())
	}
}

// sitesFor is how many functions a test attaches to on path f: closing a
// per-site perf-event uprobe costs ~0.1 s in the kernel.
func sitesFor(f kernelprobe.Features, multi, perSite int) int {
	if f.Path() == kernelprobe.PathUprobeMulti {
		return multi
	}
	return perSite
}

func mustParse(t *testing.T, specs ...string) []multiprobe.Probe {
	t.Helper()
	p, err := multiprobe.ParseProbes(specs...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// funcIndex maps a generated target's function name to its index.
func funcIndex(t testing.TB, name string) int {
	t.Helper()
	var i int
	if _, err := fmt.Sscanf(name, "func_%05d", &i); err != nil {
		t.Fatalf("site %q is not a generated function", name)
	}
	return i
}

func runTarget(t testing.TB, path string, calls int, args ...string) {
	t.Helper()
	out, err := exec.Command(path, append([]string{fmt.Sprint(calls)}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %d: %v\n%s", path, calls, err, out)
	}
}

// TestManySites attaches one program to 10,000 functions selected by one
// glob, through one link (100 functions, one uprobe each, on the per-site
// path), and checks every site's count and return value as the BPF side
// recorded them.
func TestManySites(t *testing.T) {
	forEachPath(t, func(t *testing.T, f kernelprobe.Features) {
		n, calls := sitesFor(f, 10_000, 100), 2
		target := testprogs.PrivateTarget(t, n)
		c, plans := setup(t, f, multiprobe.Options{}, []string{"uprobe:" + target + ":func_*"}, []string{"uretprobe:" + target + ":func_*"})
		before := probetest.TakeSnapshot(t, c.CountEntry, c.RecordReturn)

		l, err := plans[0].Attach(c.CountEntry)
		if err != nil {
			t.Fatal(err)
		}
		checkPath(t, l, f)
		rl, err := plans[1].Attach(c.RecordReturn)
		if err != nil {
			l.Close()
			t.Fatal(err)
		}
		// Attach built no Sites: they are read now, after the plan
		// has let its files go.
		if err := plans[0].Close(); err != nil {
			t.Fatal(err)
		}
		sites := l.Sites()
		if len(sites) != n {
			t.Fatalf("%d sites, want %d", len(sites), n)
		}
		want := sitesFor(f, 1, 2*n)
		if !f.Cookies {
			want += 2 * n // a clone per site, and its BTF
		}
		if l.NumFDs() < 1 || l.NumFDs() > want {
			t.Errorf("%d fds for %d sites in one binary, want at most %d", l.NumFDs(), n, want)
		}
		runTarget(t, target, calls)

		counts, err := testprogs.ReadArray(c.Counts, n)
		if err != nil {
			t.Fatal(err)
		}
		rets, err := testprogs.ReadArray(c.RetValues, n)
		if err != nil {
			t.Fatal(err)
		}
		retCounts, err := testprogs.ReadArray(c.RetCounts, n)
		if err != nil {
			t.Fatal(err)
		}
		bad := 0
		for cookie, s := range sites {
			i := funcIndex(t, s.Name)
			want := uint64(testprogs.ExpectedCalls(i, calls))
			if counts[cookie] != want && bad < 10 {
				bad++
				t.Errorf("site %s (cookie %d): %d calls counted, want %d", s.Name, cookie, counts[cookie], want)
			}
		}
		for cookie, s := range rl.Sites() {
			i := funcIndex(t, s.Name)
			wantN := testprogs.ExpectedCalls(i, calls)
			wantRet := testprogs.ExpectedReturn(i, uint64(wantN-1))
			if (retCounts[cookie] != uint64(wantN) || rets[cookie] != wantRet) && bad < 20 {
				bad++
				t.Errorf("return of %s (cookie %d): %d returns, last value %d; want %d, %d",
					s.Name, cookie, retCounts[cookie], rets[cookie], wantN, wantRet)
			}
		}
		var oor uint64
		if err := c.OutOfRange.Lookup(uint32(0), &oor); err != nil || oor != 0 {
			t.Errorf("%d events with a cookie out of range (%v)", oor, err)
		}

		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if err := l.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
		if err := rl.Close(); err != nil {
			t.Fatal(err)
		}
		before.FDs-- // plans[0]'s binary, closed above
		before.Check(t, "after Close")
	})
}

// TestAliasesCountedOnce selects functions by their names and their aliases
// at once: each must be attached, and counted, once.
func TestAliasesCountedOnce(t *testing.T) {
	forEachPath(t, testAliasesCountedOnce)
}

func testAliasesCountedOnce(t *testing.T, f kernelprobe.Features) {
	const n, calls = 100, 3
	target := testprogs.PrivateTarget(t, n)
	c, plans := setup(t, f, multiprobe.Options{}, []string{
		"uprobe:" + target + ":func_000[0-4]?,alias_000[0-4]?",
		"uprobe:" + target + ":func_0000?"}) // overlaps the first probe
	l := mustAttach(t, plans[0], c.CountEntry)
	checkPath(t, l, f)
	sites := l.Sites()
	if len(sites) != 50 {
		t.Fatalf("%d sites, want 50 (func_00000..func_00049; aliases fold in)", len(sites))
	}
	runTarget(t, target, calls)
	counts, err := testprogs.ReadArray(c.Counts, len(sites))
	if err != nil {
		t.Fatal(err)
	}
	for cookie, s := range sites {
		i := funcIndex(t, s.Name)
		if testprogs.HasAlias(i) && len(s.Symbol.Aliases) != 1 {
			t.Errorf("%s: aliases %q, want [%s]", s.Name, s.Symbol.Aliases, testprogs.AliasName(i))
		}
		if want := uint64(testprogs.ExpectedCalls(i, calls)); counts[cookie] != want {
			t.Errorf("%s: %d calls counted, want %d", s.Name, counts[cookie], want)
		}
	}
}

// startWaiting starts a generated target that makes its calls when it is
// told to go.
func startWaiting(t *testing.T, path string, calls int) *testprogs.Proc {
	t.Helper()
	return testprogs.Start(t, path, "-wait", fmt.Sprint(calls))
}

func TestPIDFilter(t *testing.T) {
	forEachPath(t, testPIDFilter)
}

func testPIDFilter(t *testing.T, f kernelprobe.Features) {
	const n, calls = 50, 4
	target := testprogs.PrivateTarget(t, n)
	chosen, other := startWaiting(t, target, calls), startWaiting(t, target, calls)

	c, plans := setup(t, f, multiprobe.Options{PID: chosen.PID()}, []string{"uprobe:" + target + ":func_*"})
	l := mustAttach(t, plans[0], c.CountEntry)
	checkPath(t, l, f)
	chosen.Finish(t)
	other.Finish(t)
	counts, err := testprogs.ReadArray(c.Counts, n)
	if err != nil {
		t.Fatal(err)
	}
	for cookie, s := range l.Sites() {
		i := funcIndex(t, s.Name)
		if want := uint64(testprogs.ExpectedCalls(i, calls)); counts[cookie] != want {
			t.Errorf("%s: %d calls counted, want %d (the chosen process's only)", s.Name, counts[cookie], want)
		}
	}
	var n2 uint64
	if err := c.PIDCounts.Lookup(uint32(other.PID()), &n2); err == nil {
		t.Errorf("process %d, not chosen, had %d calls counted", other.PID(), n2)
	}
}

// TestLibrary counts a libc function, named by the library's bare name, in
// a real command: sh reads a line, then execs sleep, which calls nanosleep
// once.
func TestLibrary(t *testing.T) {
	forEachPath(t, testLibrary)
}

func testLibrary(t *testing.T, f kernelprobe.Features) {
	cmd := exec.Command("/bin/sh", "-c", "read line; exec sleep 0.01")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	c, plans := setup(t, f, multiprobe.Options{PID: cmd.Process.Pid}, []string{"uprobe:libc.so.6:nanosleep"})
	l := mustAttach(t, plans[0], c.CountEntry)
	checkPath(t, l, f)
	stdin.Write([]byte("go\n"))
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	sites := l.Sites()
	if len(sites) != 1 || !strings.HasPrefix(sites[0].Path, "/") {
		t.Fatalf("sites = %+v", sites)
	}
	counts, err := testprogs.ReadArray(c.Counts, 1)
	if err != nil {
		t.Fatal(err)
	}
	if counts[0] != 1 {
		t.Errorf("nanosleep in %s called %d times by sleep, want 1", sites[0].Path, counts[0])
	}
}

// TestNothingLeftOnFailure injects failures after resolution and checks that
// nothing stays attached and no fd leaks.
func TestNothingLeftOnFailure(t *testing.T) {
	forEachPath(t, testNothingLeftOnFailure)
}

func testNothingLeftOnFailure(t *testing.T, f kernelprobe.Features) {
	const n = 20
	target := testprogs.PrivateTarget(t, n)
	second := testprogs.PrivateTarget(t, n)
	c, plans := setup(t, f, multiprobe.Options{}, []string{"uprobe:" + target + ":func_*", "uprobe:" + second + ":func_*"})
	wrong, err := testprogs.LoadCounter(otherPath(f.Path()))
	if err != nil {
		t.Fatal(err)
	}
	defer wrong.Close()

	// The second binary changes in place after Resolve: the whole attach
	// must fail, leaving the first binary's sites unattached too.
	// A binary of its own, so that the change does not reach the other
	// cases' plans.
	third := testprogs.PrivateTarget(t, n)
	_, changedPlans := setup(t, f, multiprobe.Options{}, []string{"uprobe:" + target + ":func_*", "uprobe:" + third + ":func_*"})

	tests := []struct {
		name   string
		plan   *multiprobe.Plan
		prog   *ebpf.Program
		before func()
		want   error
	}{
		{"second binary changed in place", changedPlans[0], c.CountEntry, func() {
			fd, err := os.OpenFile(third, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			fd.WriteAt([]byte{0}, 0x100)
			fd.Close()
		}, multiprobe.ErrFileChanged},
		{"program for the other path", plans[0], wrong.CountEntry, func() {}, attach.ErrWrongProgram},
	}
	native, _ := kernelprobe.Detect()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.want == attach.ErrWrongProgram {
				// A kernel without uprobe_multi loads a kprobe program with
				// that expected attach type as any other and attaches it
				// through perf events: there is no wrong path.
				testutil.RequireKernelFeature(t, native.UprobeMulti, "uprobe_multi")
			}
			before := probetest.TakeSnapshot(t, c.CountEntry, wrong.CountEntry)
			tt.before()
			l, err := tt.plan.Attach(tt.prog)
			if err == nil {
				l.Close()
				t.Fatal("attach succeeded")
			}
			if !errors.Is(err, tt.want) {
				t.Errorf("error %v, want %v", err, tt.want)
			}
			t.Log(err)
			before.Check(t, "after a failed attach")
		})
	}
}

func otherPath(p kernelprobe.Path) kernelprobe.Path {
	if p == kernelprobe.PathUprobeMulti {
		return kernelprobe.PathPerfEvent
	}
	return kernelprobe.PathUprobeMulti
}

// TestErrors checks that bad input gives errors that say what to fix.
func TestErrors(t *testing.T) {
	f := paths(t)[0]
	notELF := filepath.Join(t.TempDir(), "script")
	os.WriteFile(notELF, []byte("#!/bin/sh\necho this is not an ELF file\n"), 0o755)
	target := testprogs.PrivateTarget(t, 5)
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name     string
		spec     string
		opts     *multiprobe.Options
		want     error
		contains string
	}{
		{"missing file", "uprobe:/no/such/binary:f", nil, fs.ErrNotExist, "/no/such/binary"},
		{"missing library", "uprobe:libnosuch.so.1:f", nil, elfsym.ErrNotFound, "libnosuch.so.1"},
		{"not ELF", "uprobe:" + notELF + ":f", nil, elfsym.ErrNotELF, notELF},
		{"no match", "uprobe:" + target + ":func_0009*", nil, elfsym.ErrNoMatch, "func_0009*"},
		{"exact name missing", "uprobe:" + target + ":func_00001,no_such_func", nil, elfsym.ErrNoMatch, "no_such_func"},
		{"no such pid", "uprobe:" + target + ":func_*", &multiprobe.Options{PID: 1 << 22}, unix.ESRCH, "does not exist"},
		{"fifo", "uprobe:" + fifo + ":f", nil, elfsym.ErrNotRegular, fifo},
		{"usdt not ELF", "usdt:" + notELF + ":p:n", nil, usdt.ErrNotELF, notELF},
		{"usdt no notes", "usdt:" + target + ":p:n", nil, usdt.ErrNoProbes, target},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := multiprobe.Options{Features: &f}
			if tt.opts != nil {
				opts.PID = tt.opts.PID
			}
			pl, err := multiprobe.Resolve(mustParse(t, tt.spec), &opts)
			if err == nil {
				pl.Close()
				t.Fatal("resolve succeeded")
			}
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.contains) {
				t.Errorf("error %q: want %v, mentioning %q", err, tt.want, tt.contains)
			}
			// Resolve reads the file it opened through that descriptor;
			// the user named it by its path.
			if strings.Contains(err.Error(), "/proc/self/fd") {
				t.Errorf("error %q names the descriptor, not the file", err)
			}
		})
	}

	t.Run("not root", func(t *testing.T) {
		out := runUnprivileged(t)
		if !strings.Contains(out, "operation not permitted") || !strings.Contains(out, "CAP_BPF") {
			t.Errorf("unprivileged attach said:\n%s\nwant EPERM naming CAP_BPF", out)
		}
	})
}

// TestMain runs the unprivileged half of TestErrors/not_root, or the agent
// of TestPinAgentKilled or of TestPinKilled and TestUpdateKilled, when the test binary is started as its child,
// instead of the tests.
func TestMain(m *testing.M) {
	if dir := os.Getenv(pinAgentEnv); dir != "" {
		if at := os.Getenv(faultAgentEnv); at != "" {
			os.Exit(faultAgent(dir, at))
		}
		os.Exit(pinAgent(dir))
	}
	if os.Getenv("MULTIPROBE_UNPRIVILEGED_HELPER") == "1" {
		probes, err := multiprobe.ParseProbes("uprobe:libc.so.6:malloc")
		if err == nil {
			var pl *multiprobe.Plan
			if pl, err = multiprobe.Resolve(probes, nil); err == nil {
				pl.Close()
				fmt.Println("resolve succeeded without privileges")
				os.Exit(1)
			}
		}
		fmt.Println("ERROR:", err)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runUnprivileged runs this test binary as the user nobody, which has no
// capabilities, in its helper mode (see TestMain), and returns its output.
func runUnprivileged(t *testing.T) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// The test binary lives in a directory only root can enter.
	dir, err := os.MkdirTemp("", "multiprobe-unpriv")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	data, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "test")
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "MULTIPROBE_UNPRIVILEGED_HELPER=1", "HOME="+dir, "GOCOVERDIR="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("unprivileged helper: %v\n%s", err, out)
	}
	return string(out)
}

// TestPIDSet filters by a set of pids inside BPF and changes the set while
// attached: a process counts only while it is in the set.
func TestPIDSet(t *testing.T) {
	forEachPath(t, func(t *testing.T, f kernelprobe.Features) {
		const n, calls = 20, 2
		target := testprogs.PrivateTarget(t, n)
		a, b, c := startWaiting(t, target, calls), startWaiting(t, target, calls), startWaiting(t, target, calls)

		cnt, plans := setup(t, f, multiprobe.Options{PIDs: []int{a.PID()}}, []string{"uprobe:" + target + ":func_*"})
		l := mustAttach(t, plans[0], cnt.CountEntry)
		a.Finish(t)
		if err := l.SetPIDs(b.PID()); err != nil {
			t.Fatal(err)
		}
		b.Finish(t)
		c.Finish(t)

		var want uint64
		for i := range n {
			want += uint64(testprogs.ExpectedCalls(i, calls))
		}
		for _, p := range []struct {
			pid  int
			want uint64
		}{{a.PID(), want}, {b.PID(), want}, {c.PID(), 0}} {
			var got uint64
			cnt.PIDCounts.Lookup(uint32(p.pid), &got)
			if got != p.want {
				t.Errorf("process %d: %d calls counted, want %d", p.pid, got, p.want)
			}
		}
	})
}

// TestCookiesAcrossProbes mixes probes of two kinds over one file, one of
// them overlapping an earlier one in part: every site must keep the cookie
// that is its index in Link.Sites, whichever way its offsets reached the
// kernel, so each site's count is its own function's calls.
func TestCookiesAcrossProbes(t *testing.T) {
	forEachPath(t, testCookiesAcrossProbes)
}

func testCookiesAcrossProbes(t *testing.T, f kernelprobe.Features) {
	const n, calls = 100, 2
	target := testprogs.PrivateTarget(t, n)
	c, plans := setup(t, f, multiprobe.Options{}, []string{
		"uprobe:" + target + ":func_0000?",
		"uretprobe:" + target + ":func_0001?",
		"uprobe:" + target + ":func_000[0-2]?", // func_0000? again: only func_0002? is new
		"uretprobe:" + target + ":func_0003?,func_0001?"})
	l := mustAttach(t, plans[0], c.CountEntry)
	checkPath(t, l, f)
	sites := l.Sites()
	if len(sites) != 50 {
		t.Fatalf("%d sites, want 50", len(sites))
	}
	runTarget(t, target, calls)
	counts, err := testprogs.ReadArray(c.Counts, len(sites))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for cookie, s := range sites {
		if s.Cookie != uint64(cookie) {
			t.Errorf("%s: Cookie %d at index %d", s.Name, s.Cookie, cookie)
		}
		key := s.Probe.Kind.String() + " " + s.Name
		if seen[key] {
			t.Errorf("%s twice", key)
		}
		seen[key] = true
		if want := uint64(testprogs.ExpectedCalls(funcIndex(t, s.Name), calls)); counts[cookie] != want {
			t.Errorf("%s (%s, cookie %d): %d calls counted, want %d", s.Name, s.Probe.Kind, cookie, counts[cookie], want)
		}
	}
}

// TestSession attaches a uprobe session program through the root package:
// it must run at every site's entry and return, and see the return value,
// and the specs and paths that cannot be sessions must be refused.
func TestSession(t *testing.T) {
	all := paths(t)
	native := all[0]
	testutil.RequireKernelFeature(t, native.UprobeSession, "uprobe sessions")
	s, err := testprogs.LoadSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const n, calls = 50, 2
	target := testprogs.PrivateTarget(t, n)
	pl, err := multiprobe.Resolve(mustParse(t, "uprobe:"+target+":func_*"), &multiprobe.Options{Session: true, Features: &native})
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Close()
	l := mustAttach(t, pl, s.CountSession)
	runTarget(t, target, calls)
	sites := l.Sites()
	entries, _ := testprogs.ReadArray(s.Entries, len(sites))
	returns, _ := testprogs.ReadArray(s.Returns, len(sites))
	values, err := testprogs.ReadArray(s.Values, len(sites))
	if err != nil {
		t.Fatal(err)
	}
	for cookie, site := range sites {
		i := funcIndex(t, site.Name)
		k := uint64(testprogs.ExpectedCalls(i, calls))
		if entries[cookie] != k || returns[cookie] != k || values[cookie] != testprogs.ExpectedReturn(i, k-1) {
			t.Errorf("%s: %d entries, %d returns, last value %d; want %d, %d, %d", site.Name,
				entries[cookie], returns[cookie], values[cookie], k, k, testprogs.ExpectedReturn(i, k-1))
		}
	}

	perfEvent := native
	perfEvent.UprobeMulti, perfEvent.UprobeMultiPIDFilter, perfEvent.UprobeSession = false, false, false
	noSession := native
	noSession.UprobeSession = false
	for _, tt := range []struct {
		name     string
		spec     string
		features kernelprobe.Features
		want     error
	}{
		{"uretprobe", "uretprobe:" + target + ":func_*", native, multiprobe.ErrBadSpec},
		{"usdt", "usdt:" + testprogs.USDTTarget(t) + ":*:*", native, multiprobe.ErrBadSpec},
		{"perf-event path", "uprobe:" + target + ":func_*", perfEvent, attach.ErrSessionUnsupported},
		{"kernel before 6.13", "uprobe:" + target + ":func_*", noSession, attach.ErrSessionUnsupported},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pl, err := multiprobe.Resolve(mustParse(t, tt.spec), &multiprobe.Options{Session: true, Features: &tt.features})
			if err == nil {
				pl.Close()
				t.Fatal("resolve succeeded")
			}
			if !errors.Is(err, tt.want) {
				t.Errorf("error %q, want %v", err, tt.want)
			}
		})
	}
}

// TestPIDRoot probes a process that runs chrooted, by the path it has
// inside its root: with Options.PID, a target is looked up in the process's
// root (/proc/PID/root), not in this process's.
func TestPIDRoot(t *testing.T) {
	forEachPath(t, testPIDRoot)
}

func testPIDRoot(t *testing.T, f kernelprobe.Features) {
	const n, calls = 5, 3
	target := testprogs.PrivateTarget(t, n)
	root := testprogs.Root(t, target, "/app/bin/target")
	chroot, err := exec.LookPath("chroot")
	if err != nil {
		testutil.RequireTool(t, "chroot", err)
	}
	p := testprogs.Start(t, chroot, root, "/app/bin/target", "-wait", fmt.Sprint(calls))

	// /app/bin/target exists only in the process's root.
	if _, err := multiprobe.Resolve(mustParse(t, "uprobe:/app/bin/target:func_*"), &multiprobe.Options{Features: &f}); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Resolve without PID: %v, want fs.ErrNotExist", err)
	}
	c, plans := setup(t, f, multiprobe.Options{PID: p.PID()}, []string{"uprobe:/app/bin/target:func_*"})
	l := mustAttach(t, plans[0], c.CountEntry)
	if s := l.Sites()[0]; !strings.HasPrefix(s.Path, "/proc/"+fmt.Sprint(p.PID())+"/root/") {
		t.Errorf("site path %s, want it under the process's root", s.Path)
	}
	p.Finish(t)
	counts, err := testprogs.ReadArray(c.Counts, n)
	if err != nil {
		t.Fatal(err)
	}
	for cookie, s := range l.Sites() {
		if want := uint64(testprogs.ExpectedCalls(funcIndex(t, s.Name), calls)); counts[cookie] != want {
			t.Errorf("%s: %d calls counted, want %d", s.Name, counts[cookie], want)
		}
	}
}
