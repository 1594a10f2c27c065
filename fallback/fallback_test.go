package fallback

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/multiprobe/multiprobe/attach"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/probetest"
	"golang.org/x/sys/unix"
)

// Closing a per-site uprobe costs the kernel ~0.1 s, so site counts stay
// small here: the whole package's tests detach about 200 sites.

// TestUprobes attaches entry probes to every function of a generated target
// and return probes to some, and checks what the BPF programs counted.
func TestUprobes(t *testing.T) {
	probetest.RequireBPF(t)
	// Default cookies tell the sites apart; kernels without them get a
	// program per site (TestPerSitePrograms).
	testutil.RequireKernelFeature(t, features(t, nil).Cookies, "BPF cookies")
	const n, nret, calls = 120, 40, 3
	path := testprogs.PrivateTarget(t, n)
	offs, err := testprogs.TargetOffsets(path, n)
	if err != nil {
		t.Fatal(err)
	}
	c, err := testprogs.LoadCounter(kernelprobe.PathPerfEvent)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	snap := probetest.TakeSnapshot(t, c.CountEntry, c.RecordReturn)

	// Two targets on one binary, to check that default cookies continue
	// from one target to the next.
	entry, err := Uprobes(c.CountEntry, []attach.Target{{Path: path, Offsets: offs[:n/2]}, {Path: path, Offsets: offs[n/2:]}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	retCookies := make([]uint64, nret)
	for i := range retCookies {
		retCookies[i] = uint64(i)
	}
	ret, err := Uprobes(c.RecordReturn, []attach.Target{{Path: path, Offsets: offs[:nret], Cookies: retCookies}}, &Options{Return: true})
	if err != nil {
		t.Fatal(err)
	}
	if entry.Sites() != n || ret.Sites() != nret {
		t.Errorf("Sites() = %d, %d; want %d, %d", entry.Sites(), ret.Sites(), n, nret)
	}
	for i, ck := range entry.Cookies() {
		if ck != uint64(i) {
			t.Fatalf("cookie of site %d is %d", i, ck)
		}
	}
	if got := len(entry.Targets()); got != 2 {
		t.Errorf("Targets() has %d targets, want 2", got)
	}
	if got := entry.NumFDs(); got != 2*n {
		t.Errorf("NumFDs() = %d, want %d", got, 2*n)
	}
	fds, _ := testutil.OpenFDs()
	if want := snap.FDs + 2*(n+nret); fds != want {
		t.Errorf("%d fds open while attached, want %d", fds, want)
	}
	if links := probetest.ProgramLinks(t, c.CountEntry, c.RecordReturn); len(links) != n+nret {
		t.Errorf("kernel has %d links of the programs, want %d", len(links), n+nret)
	}

	cmd := exec.Command(path, fmt.Sprint(calls))
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	counts, err := testprogs.ReadArray(c.Counts, n)
	if err != nil {
		t.Fatal(err)
	}
	for i, got := range counts {
		if want := uint64(testprogs.ExpectedCalls(i, calls)); got != want {
			t.Errorf("%s: %d calls counted, want %d", testprogs.FuncName(i), got, want)
		}
	}
	for i := range n {
		var pid uint32
		if err := c.LastPID.Lookup(uint32(i), &pid); err != nil || int(pid) != cmd.Process.Pid {
			t.Errorf("%s: last pid %d (%v), want %d", testprogs.FuncName(i), pid, err, cmd.Process.Pid)
		}
	}
	rets, _ := testprogs.ReadArray(c.RetCounts, nret)
	vals, _ := testprogs.ReadArray(c.RetValues, nret)
	for i := range nret {
		want := testprogs.ExpectedCalls(i, calls)
		if rets[i] != uint64(want) {
			t.Errorf("%s: %d returns, want %d", testprogs.FuncName(i), rets[i], want)
		}
		if w := testprogs.ExpectedReturn(i, uint64(want-1)); vals[i] != w {
			t.Errorf("%s: last return value %d, want %d", testprogs.FuncName(i), vals[i], w)
		}
	}

	for _, l := range []*Link{entry, ret} {
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if err := l.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
		if l.NumFDs() != 0 {
			t.Errorf("NumNumFDs() = %d after Close", l.NumFDs())
		}
	}
	snap.Check(t, "after Close")

	// Nothing fires after Close.
	if err := exec.Command(path, "1").Run(); err != nil {
		t.Fatal(err)
	}
	after, _ := testprogs.ReadArray(c.Counts, n)
	for i := range n {
		if after[i] != counts[i] {
			t.Fatalf("%s counted after Close: %d, then %d", testprogs.FuncName(i), counts[i], after[i])
		}
	}
}

// TestRefCtr checks that a site's ref counter (a USDT semaphore) is raised
// while it is attached and back to 0 after.
func TestRefCtr(t *testing.T) {
	probetest.RequireBPF(t)
	path := buildSema(t, "pie")
	c := loadCookieCounter(t)
	p := testprogs.Start(t, path)
	if got := p.Do(t, "v"); got != "0 0" {
		t.Fatalf("semaphores before attach: %s", got)
	}
	fns := semaFuncs(t, path)
	sema := symOffset(t, path, "mp_sema")
	l, err := Uprobes(c.prog, []attach.Target{{Path: path, Offsets: fns, RefCtrOffsets: []uint64{sema, 0, sema}}},
		c.siteOptions(t, []uint64{0, 1, 2}))
	if err != nil {
		t.Fatal(err)
	}
	// Two sites share the counter.
	if got := p.Do(t, "v"); got != "2 0" {
		t.Errorf("semaphores while attached: %s, want 2 0", got)
	}
	p.Do(t, "c 4")
	for i := range 3 {
		if got := c.count(t, uint32(i)); got != uint64(4+i) {
			t.Errorf("fn%d: %d calls, want %d", i, got, 4+i)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	// Other test packages walk the kernel's links by ID: when one held a
	// link, its letting go releases the perf event, after Close (see
	// Close).
	got := p.Do(t, "v")
	for deadline := time.Now().Add(2 * time.Second); got != "0 0" && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		got = p.Do(t, "v")
	}
	if got != "0 0" {
		t.Errorf("semaphores 2 s after Close: %s, want 0 0", got)
	}
}

// TestAllOrNothing makes the kernel refuse the last site (a second,
// different ref counter at an offset that has one) and checks that
// nothing stays attached.
func TestAllOrNothing(t *testing.T) {
	probetest.RequireBPF(t)
	path := buildSema(t, "pie")
	c := loadCookieCounter(t)
	p := testprogs.Start(t, path)
	fns := semaFuncs(t, path)
	sema, sema2 := symOffset(t, path, "mp_sema"), symOffset(t, path, "mp_sema2")
	snap := probetest.TakeSnapshot(t, c.prog)

	_, err := Uprobes(c.prog, []attach.Target{{
		Path:          path,
		Offsets:       []uint64{fns[0], fns[1], fns[2], fns[1]},
		RefCtrOffsets: []uint64{0, sema, 0, sema2},
		Names:         []string{"fn0", "fn1", "fn2", "fn1-again"},
	}}, nil)
	if err == nil {
		t.Fatal("conflicting ref counters attached")
	}
	if !errors.Is(err, unix.EINVAL) || !strings.Contains(err.Error(), "fn1-again") {
		t.Errorf("error %q: want EINVAL naming the site fn1-again", err)
	}
	snap.Check(t, "after the failed attach")
	if got := p.Do(t, "v"); got != "0 0" {
		t.Errorf("semaphores after the failed attach: %s, want 0 0", got)
	}
	p.Do(t, "c 1")
	for i := range 3 {
		if got := c.count(t, uint32(i)); got != 0 {
			t.Errorf("fn%d counted %d times after the failed attach", i, got)
		}
	}
}

// TestPerSitePrograms attaches one program per site, as on kernels
// without BPF cookies (before Linux 5.15): entry and return probes on the
// same functions, each site's clone counting under its own built-in
// cookie. On such a kernel nothing else tells the sites apart: the kernel
// cookie below is 0 for all (Features say there are none).
func TestPerSitePrograms(t *testing.T) {
	probetest.RequireBPF(t)
	noCookies := features(t, func(f *kernelprobe.Features) { f.UprobeMulti, f.Cookies = false, false })
	for _, kind := range []string{"nopie", "pie"} {
		t.Run(kind, func(t *testing.T) {
			path := buildSema(t, kind)
			c := loadCookieCounter(t)
			fns := semaFuncs(t, path)
			entryCookies, retCookies := []uint64{7, 8, 9}, []uint64{10, 11, 12}
			entryProgs, retProgs := c.clones(t, entryCookies), c.clones(t, retCookies)
			p := testprogs.Start(t, path)
			snap := probetest.TakeSnapshot(t, slices.Concat(entryProgs, retProgs)...)
			entry, err := Uprobes(nil, []attach.Target{{Path: path, Offsets: fns, Cookies: entryCookies}},
				&Options{Features: noCookies, Programs: entryProgs})
			if err != nil {
				t.Fatal(err)
			}
			defer entry.Close()
			ret, err := Uprobes(nil, []attach.Target{{Path: path, Offsets: fns, Cookies: retCookies}},
				&Options{Features: noCookies, Return: true, Programs: retProgs})
			if err != nil {
				t.Fatal(err)
			}
			defer ret.Close()
			p.Do(t, "c 2")
			for i := range fns {
				for _, ck := range []uint64{entryCookies[i], retCookies[i]} {
					if got := c.count(t, uint32(ck)); got != uint64(2+i) {
						t.Errorf("fn%d (cookie %d): %d calls, want %d", i, ck, got, 2+i)
					}
				}
			}
			if m := c.missed(t); m != 0 {
				t.Errorf("%d events without a cookie", m)
			}
			if err := errors.Join(entry.Close(), ret.Close()); err != nil {
				t.Fatal(err)
			}
			snap.Check(t, "after Close")
		})
	}

	t.Run("count", func(t *testing.T) {
		path := buildSema(t, "nopie")
		c := loadCookieCounter(t)
		_, err := Uprobes(nil, []attach.Target{{Path: path, Offsets: semaFuncs(t, path)}},
			&Options{Features: noCookies, Programs: c.clones(t, []uint64{1, 2})})
		if !errors.Is(err, attach.ErrInvalidOptions) {
			t.Errorf("2 programs for 3 sites: %v, want ErrInvalidOptions", err)
		}
	})
}

// TestFDBudget lowers RLIMIT_NOFILE around Uprobes: the soft limit here,
// the hard limit in a child process, since lowering it cannot be undone
// without CAP_SYS_RESOURCE.
func TestFDBudget(t *testing.T) {
	probetest.RequireBPF(t)
	path := buildSema(t, "nopie")
	c := loadCookieCounter(t)
	var orig unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &orig); err != nil {
		t.Fatal(err)
	}
	open, _ := testutil.OpenFDs()
	target := []attach.Target{{Path: path, Offsets: semaFuncs(t, path)}}

	if os.Getenv(fdChildEnv) != "" {
		// A hard limit too low: refused before anything is attached.
		low := unix.Rlimit{Cur: uint64(open + 10), Max: uint64(open + 10)}
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
			t.Fatal(err)
		}
		snap := probetest.TakeSnapshot(t, c.prog)
		_, err := Uprobes(c.prog, target, nil)
		if !errors.Is(err, ErrFDBudget) || !strings.Contains(err.Error(), "need 6 file descriptors") {
			t.Errorf("low hard limit: %v, want ErrFDBudget saying 6 are needed", err)
		}
		snap.Check(t, "after the refusal")
		return
	}
	t.Run("hard", func(t *testing.T) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestFDBudget$", "-test.v")
		cmd.Env = append(os.Environ(), fdChildEnv+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestFDBudget") {
			t.Errorf("child: %v\n%s", err, out)
		}
	})

	t.Run("soft", func(t *testing.T) {
		defer unix.Setrlimit(unix.RLIMIT_NOFILE, &orig)
		soft := unix.Rlimit{Cur: uint64(open + 10), Max: orig.Max}
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &soft); err != nil {
			t.Fatal(err)
		}
		l, err := Uprobes(c.prog, target, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		var now unix.Rlimit
		unix.Getrlimit(unix.RLIMIT_NOFILE, &now)
		if now.Cur != orig.Max {
			t.Errorf("soft limit %d after Uprobes, want the hard limit %d", now.Cur, orig.Max)
		}
	})
}

const fdChildEnv = "MULTIPROBE_FALLBACK_FD_CHILD"

// TestInvalid checks the errors that come before anything is attached.
func TestInvalid(t *testing.T) {
	probetest.RequireBPF(t)
	path := buildSema(t, "nopie")
	c := loadCookieCounter(t)
	fns := semaFuncs(t, path)
	st, _ := os.Stat(path)
	socket, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SocketFilter, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	defer socket.Close()
	multi, err := testprogs.LoadCounter(kernelprobe.PathUprobeMulti)
	if err != nil {
		t.Fatal(err)
	}
	defer multi.Close()
	noRefCtr := features(t, func(f *kernelprobe.Features) { f.RefCtrOffset = false })
	one := func(t attach.Target) []attach.Target { return []attach.Target{t} }

	for _, tc := range []struct {
		name    string
		prog    *ebpf.Program
		targets []attach.Target
		opts    *Options
		want    error
	}{
		{"nil program", nil, one(attach.Target{Path: path, Offsets: fns}), nil, attach.ErrWrongProgram},
		{"socket filter", socket, one(attach.Target{Path: path, Offsets: fns}), nil, attach.ErrWrongProgram},
		{"loaded for uprobe_multi", multi.CountEntry, one(attach.Target{Path: path, Offsets: fns}), nil, attach.ErrWrongProgram},
		{"no targets", c.prog, nil, nil, attach.ErrInvalidTarget},
		{"no path", c.prog, one(attach.Target{Offsets: fns}), nil, attach.ErrInvalidTarget},
		{"no offsets", c.prog, one(attach.Target{Path: path}), nil, attach.ErrInvalidTarget},
		{"offset 0", c.prog, one(attach.Target{Path: path, Offsets: []uint64{0}}), nil, attach.ErrInvalidTarget},
		{"past the end", c.prog, one(attach.Target{Path: path, Offsets: []uint64{uint64(st.Size())}}), nil, attach.ErrInvalidTarget},
		{"cookies", c.prog, one(attach.Target{Path: path, Offsets: fns, Cookies: []uint64{1}}), nil, attach.ErrInvalidTarget},
		{"odd ref counter", c.prog, one(attach.Target{Path: path, Offsets: fns[:1], RefCtrOffsets: []uint64{3}}), nil, attach.ErrInvalidTarget},
		{"directory", c.prog, one(attach.Target{Path: "/", Offsets: fns}), nil, attach.ErrInvalidTarget},
		{"missing", c.prog, one(attach.Target{Path: path + ".missing", Offsets: fns}), nil, fs.ErrNotExist},
		{"ref counter unsupported", c.prog, one(attach.Target{Path: path, Offsets: fns[:1], RefCtrOffsets: []uint64{2}}), &Options{Features: noRefCtr}, ErrRefCtrUnsupported},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.prog == multi.CountEntry {
				// A kernel without uprobe_multi loads a kprobe program
				// with that expected attach type as any other.
				f, _ := kernelprobe.Detect()
				testutil.RequireKernelFeature(t, f.UprobeMulti, "uprobe_multi")
			}
			snap := probetest.TakeSnapshot(t, c.prog)
			l, err := Uprobes(tc.prog, tc.targets, tc.opts)
			if err == nil {
				l.Close()
				t.Fatal("no error")
			}
			if !errors.Is(err, tc.want) {
				t.Errorf("error %q does not wrap %v", err, tc.want)
			}
			snap.Check(t, "after the error")
		})
	}
}

// TestProgress checks Options.Progress: counts that only grow, the end of
// each phase reported once with every site, never two calls at once, and
// the attach phase over before the detach phase starts.
func TestProgress(t *testing.T) {
	probetest.RequireBPF(t)
	const n = 20
	path := testprogs.PrivateTarget(t, n)
	offs, err := testprogs.TargetOffsets(path, n)
	if err != nil {
		t.Fatal(err)
	}
	c, err := testprogs.LoadCounter(kernelprobe.PathPerfEvent)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	type report struct {
		phase       string
		done, total int
	}
	var (
		reports []report
		inside  atomic.Bool
	)
	progress := func(phase string, done, total int) {
		if inside.Swap(true) {
			t.Error("Progress called while a call was running")
		}
		defer inside.Store(false)
		reports = append(reports, report{phase, done, total})
	}
	l, err := Uprobes(c.CountEntry, []attach.Target{{Path: path, Offsets: offs}}, &Options{Progress: progress})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	last := map[string]int{}
	ends := map[string]int{}
	for i, r := range reports {
		if r.total != n || r.done < last[r.phase] || r.done > n {
			t.Errorf("report %d: %+v after %d done", i, r, last[r.phase])
		}
		if r.phase == PhaseAttach && ends[PhaseDetach] > 0 || r.phase == PhaseAttach && last[PhaseDetach] > 0 {
			t.Errorf("report %d: %+v after the detach phase began", i, r)
		}
		last[r.phase] = r.done
		if r.done == n {
			ends[r.phase]++
		}
	}
	if reports[len(reports)-1] != (report{PhaseDetach, n, n}) || last[PhaseAttach] != n {
		t.Errorf("reports %+v: want both phases to end with %d of %d", reports, n, n)
	}
}
