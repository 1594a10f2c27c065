package attach

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/multiprobe/multiprobe/elfsym"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/probetest"
	"golang.org/x/sys/unix"
)

// setup builds a private target with n functions, loads the counter
// programs for the uprobe_multi path and returns them with the functions'
// offsets.
func setup(t *testing.T, n int) (string, []uint64, *testprogs.Counter) {
	t.Helper()
	probetest.RequireBPF(t)
	f, err := kernelprobe.Detect()
	if err != nil {
		t.Fatal(err)
	}
	testutil.RequireKernelFeature(t, f.UprobeMulti, "uprobe_multi")
	path := testprogs.PrivateTarget(t, n)
	offsets, err := testprogs.TargetOffsets(path, n)
	if err != nil {
		t.Fatal(err)
	}
	c, err := testprogs.LoadCounter(kernelprobe.PathUprobeMulti)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return path, offsets, c
}

// run runs a target to completion and checks its output.
func run(t *testing.T, path string, n, calls int) {
	t.Helper()
	out, err := exec.Command(path, strconv.Itoa(calls)).Output()
	if err != nil {
		t.Fatalf("%s %d: %v", path, calls, err)
	}
	if want := fmt.Sprintf("done %d\n", testprogs.ExpectedSum(n, calls)); string(out) != want {
		t.Fatalf("%s printed %q, want %q", path, out, want)
	}
}

func names(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = testprogs.FuncName(i)
	}
	return out
}

func TestUprobeMultiCounts(t *testing.T) {
	const n, calls = 10_000, 2
	path, offsets, c := setup(t, n)
	before := probetest.TakeSnapshot(t, c.CountEntry)

	l, err := UprobeMulti(c.CountEntry, []Target{{Path: path, Offsets: offsets, Names: names(n)}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if l.NumFDs() != 1 || l.Sites() != n {
		t.Errorf("NumFDs() = %d, Sites() = %d; want 1, %d", l.NumFDs(), l.Sites(), n)
	}
	attached := probetest.TakeSnapshot(t, c.CountEntry)
	if attached.FDs != before.FDs+1 || len(attached.Links) != len(before.Links)+1 {
		t.Errorf("attaching %d sites took %d fds and %d kernel links, want 1 and 1",
			n, attached.FDs-before.FDs, len(attached.Links)-len(before.Links))
	}

	infos, err := l.Info()
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 1 {
		t.Fatalf("Info() has %d links, want 1", len(infos))
	}
	in := infos[0]
	wantCookies := make([]uint64, n)
	for i := range wantCookies {
		wantCookies[i] = uint64(i)
	}
	if in.Path != path || in.Return || in.PID != 0 || !slices.Equal(in.Offsets, offsets) ||
		!slices.Equal(in.Cookies, wantCookies) || !slices.Equal(l.Cookies(), wantCookies) ||
		!slices.Contains(attached.Links, in.ID) {
		t.Errorf("Info() = {ID %d, Path %q, Return %v, PID %d, %d offsets, %d cookies}, not what was attached",
			in.ID, in.Path, in.Return, in.PID, len(in.Offsets), len(in.Cookies))
	}

	run(t, path, n, calls)
	counts, err := testprogs.ReadArray(c.Counts, n)
	if err != nil {
		t.Fatal(err)
	}
	bad := 0
	for i, got := range counts {
		if want := uint64(testprogs.ExpectedCalls(i, calls)); got != want {
			if bad++; bad <= 5 {
				t.Errorf("site %s: %d calls counted, want %d", testprogs.FuncName(i), got, want)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d sites miscounted", bad, n)
	}

	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if l.NumFDs() != 0 {
		t.Errorf("NumFDs() after Close = %d", l.NumFDs())
	}
	if _, err := l.Info(); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Info() after Close: %v, want os.ErrClosed", err)
	}
	before.Check(t, "after Close")

	// Detached: another run adds nothing.
	run(t, path, n, calls)
	again, err := testprogs.ReadArray(c.Counts, n)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(again, counts) {
		t.Error("sites still counted after Close")
	}
}

func TestReturnProbes(t *testing.T) {
	const n, calls = 1000, 3
	path, offsets, c := setup(t, n)

	l, err := UprobeMulti(c.RecordReturn, []Target{{Path: path, Offsets: offsets}}, &Options{Return: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	infos, err := l.Info()
	if err != nil {
		t.Fatal(err)
	}
	if !infos[0].Return {
		t.Error("Info().Return = false for return probes")
	}
	run(t, path, n, calls)
	rets, err := testprogs.ReadArray(c.RetCounts, n)
	if err != nil {
		t.Fatal(err)
	}
	vals, err := testprogs.ReadArray(c.RetValues, n)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		k := testprogs.ExpectedCalls(i, calls)
		if rets[i] != uint64(k) || vals[i] != testprogs.ExpectedReturn(i, uint64(k-1)) {
			t.Fatalf("site %s: %d returns, last value %d; want %d, %d",
				testprogs.FuncName(i), rets[i], vals[i], k, testprogs.ExpectedReturn(i, uint64(k-1)))
		}
	}
}

func TestSession(t *testing.T) {
	const n, calls = 500, 2
	path, offsets, _ := setup(t, n)
	f, _ := kernelprobe.Detect()
	testutil.RequireKernelFeature(t, f.UprobeSession, "uprobe sessions")
	s, err := testprogs.LoadSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	l, err := UprobeMulti(s.CountSession, []Target{{Path: path, Offsets: offsets}}, &Options{Session: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	run(t, path, n, calls)
	entries, _ := testprogs.ReadArray(s.Entries, n)
	returns, _ := testprogs.ReadArray(s.Returns, n)
	values, err := testprogs.ReadArray(s.Values, n)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		k := uint64(testprogs.ExpectedCalls(i, calls))
		if entries[i] != k || returns[i] != k || values[i] != testprogs.ExpectedReturn(i, k-1) {
			t.Fatalf("site %s: %d entries, %d returns, last value %d; want %d, %d, %d", testprogs.FuncName(i),
				entries[i], returns[i], values[i], k, k, testprogs.ExpectedReturn(i, k-1))
		}
	}
}

func TestPIDFilter(t *testing.T) {
	const n, calls = 200, 2
	path, offsets, c := setup(t, n)
	f, _ := kernelprobe.Detect()
	testutil.RequireKernelFeature(t, f.UprobeMultiPIDFilter, "working uprobe_multi pid filter")

	a := testprogs.Start(t, path, "-wait", strconv.Itoa(calls))
	b := testprogs.Start(t, path, "-wait", strconv.Itoa(calls))
	l, err := UprobeMulti(c.CountEntry, []Target{{Path: path, Offsets: offsets}}, &Options{PID: a.PID()})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if infos, err := l.Info(); err != nil || infos[0].PID != uint32(a.PID()) {
		t.Errorf("Info() = %+v, %v; want PID %d", infos, err, a.PID())
	}
	a.Finish(t)
	b.Finish(t)

	var want uint64
	for i := range n {
		want += uint64(testprogs.ExpectedCalls(i, calls))
	}
	var got uint64
	if err := c.PIDCounts.Lookup(uint32(a.PID()), &got); err != nil || got != want {
		t.Errorf("pid %d (filtered for): %d calls counted (%v), want %d", a.PID(), got, err, want)
	}
	if err := c.PIDCounts.Lookup(uint32(b.PID()), &got); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Errorf("pid %d (filtered out): %d calls counted (%v), want none", b.PID(), got, err)
	}
}

func TestSeveralTargetsAndCookies(t *testing.T) {
	const n, calls = 300, 1
	pathA, offsets, c := setup(t, n)
	pathB := testprogs.PrivateTarget(t, n) // same content, another inode
	before := probetest.TakeSnapshot(t, c.CountEntry)

	// A gets the default cookies 0…n-1, B continues with n…2n-1; C's are
	// given, reversed, in the upper half of the arrays.
	pathC := testprogs.PrivateTarget(t, n)
	custom := make([]uint64, n)
	for i := range custom {
		custom[i] = uint64(3*n - 1 - i)
	}
	l, err := UprobeMulti(c.CountEntry, []Target{
		{Path: pathA, Offsets: offsets},
		{Path: pathB, Offsets: offsets},
		{Path: pathC, Offsets: offsets, Cookies: custom},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if l.NumFDs() != 3 || probetest.TakeSnapshot(t, c.CountEntry).FDs != before.FDs+3 {
		t.Errorf("3 binaries: NumFDs() = %d, want 3 (one per binary)", l.NumFDs())
	}
	run(t, pathB, n, calls)
	run(t, pathC, n, calls)
	counts, err := testprogs.ReadArray(c.Counts, 3*n)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		k := uint64(testprogs.ExpectedCalls(i, calls))
		if counts[i] != 0 || counts[n+i] != k || counts[3*n-1-i] != k {
			t.Fatalf("site %d: counts A %d, B %d, C %d; want 0, %d, %d", i, counts[i], counts[n+i], counts[3*n-1-i], k, k)
		}
	}
	l.Close()
	before.Check(t, "after Close")
}

func TestSplit(t *testing.T) {
	const n, calls = 1000, 1
	path, offsets, c := setup(t, n)
	defer func(old int) { sitesPerLink = old }(sitesPerLink)
	sitesPerLink = 300
	before := probetest.TakeSnapshot(t, c.CountEntry)

	l, err := UprobeMulti(c.CountEntry, []Target{{Path: path, Offsets: offsets}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if l.NumFDs() != 4 {
		t.Errorf("%d sites at 300 per link: NumFDs() = %d, want 4", n, l.NumFDs())
	}
	infos, err := l.Info()
	if err != nil {
		t.Fatal(err)
	}
	var all []uint64
	for i, in := range infos {
		if in.First != 300*i || in.Target != 0 {
			t.Errorf("link %d: Target %d First %d, want 0, %d", i, in.Target, in.First, 300*i)
		}
		all = append(all, in.Offsets...)
	}
	if !slices.Equal(all, offsets) {
		t.Error("the links' offsets together are not the target's")
	}
	run(t, path, n, calls)
	counts, _ := testprogs.ReadArray(c.Counts, n)
	for i := range n {
		if counts[i] != uint64(testprogs.ExpectedCalls(i, calls)) {
			t.Fatalf("site %d: %d calls counted, want %d", i, counts[i], testprogs.ExpectedCalls(i, calls))
		}
	}
	l.Close()
	before.Check(t, "after Close")
}

// TestFailuresLeaveNothing checks that a failed attach leaves no link and no
// fd behind, even when the failure comes from the kernel after other links
// were made, and that the error says what went wrong.
func TestFailuresLeaveNothing(t *testing.T) {
	const n = 100
	path, offsets, c := setup(t, n)
	perfProg, err := testprogs.LoadCounter(kernelprobe.PathPerfEvent)
	if err != nil {
		t.Fatal(err)
	}
	defer perfProg.Close()
	size := func() uint64 {
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return uint64(st.Size())
	}()
	missing := filepath.Join(t.TempDir(), "no-such-binary")
	// Two different ref-counter offsets at one site: the kernel refuses the
	// second link with EINVAL after making the first.
	refA, refB := make([]uint64, n), make([]uint64, n)
	refA[0], refB[0] = 0x10, 0x20

	for _, tc := range []struct {
		name    string
		prog    *ebpf.Program
		targets []Target
		opts    *Options
		is      []error
		says    []string
		session bool // needs uprobe sessions (6.13)
	}{{
		name:    "second binary missing",
		targets: []Target{{Path: path, Offsets: offsets}, {Path: missing, Offsets: offsets}},
		is:      []error{fs.ErrNotExist},
		says:    []string{"target 2 of 2", missing},
	}, {
		name:    "offset past the end",
		targets: []Target{{Path: path, Offsets: offsets}, {Path: path, Offsets: []uint64{offsets[0], size + 16}, Names: []string{"f", "beyond"}}},
		is:      []error{ErrInvalidTarget},
		says:    []string{path, "beyond", "past the end"},
	}, {
		name:    "program loaded for the perf-event path",
		prog:    perfProg.CountEntry,
		targets: []Target{{Path: path, Offsets: offsets}},
		is:      []error{ErrWrongProgram, unix.EINVAL},
		says:    []string{"PrepareProgramSpec"},
	}, {
		name:    "session with an entry program",
		targets: []Target{{Path: path, Offsets: offsets}},
		opts:    &Options{Session: true},
		is:      []error{ErrWrongProgram},
		says:    []string{"uprobe.session"},
		session: true,
	}, {
		name:    "kernel refuses the second link",
		targets: []Target{{Path: path, Offsets: offsets, RefCtrOffsets: refA}, {Path: path, Offsets: offsets, RefCtrOffsets: refB}},
		is:      []error{unix.EINVAL},
		says:    []string{path, "target 2 of 2", "ref-counter"},
	}, {
		name:    "no such process",
		targets: []Target{{Path: path, Offsets: offsets}},
		opts:    &Options{PID: 1<<22 + 12345},
		is:      []error{unix.ESRCH},
		says:    []string{"process 4206649 does not exist"},
	}, {
		name:    "directory",
		targets: []Target{{Path: t.TempDir(), Offsets: []uint64{0}}},
		is:      []error{ErrInvalidTarget},
		says:    []string{"not a regular file"},
	}, {
		name:    "odd ref-counter offset",
		targets: []Target{{Path: path, Offsets: offsets[:1], RefCtrOffsets: []uint64{0x11}}},
		is:      []error{ErrInvalidTarget},
		says:    []string{"odd"},
	}, {
		name:    "cookies of the wrong length",
		targets: []Target{{Path: path, Offsets: offsets, Cookies: []uint64{1}}},
		is:      []error{ErrInvalidTarget},
		says:    []string{"1 Cookies for 100 offsets"},
	}, {
		name: "no targets",
		is:   []error{ErrInvalidTarget},
	}, {
		name:    "no offsets",
		targets: []Target{{Path: path}},
		is:      []error{ErrInvalidTarget},
	}, {
		name:    "session and return",
		targets: []Target{{Path: path, Offsets: offsets}},
		opts:    &Options{Session: true, Return: true},
		is:      []error{ErrInvalidOptions},
	}, {
		name:    "negative pid",
		targets: []Target{{Path: path, Offsets: offsets}},
		opts:    &Options{PID: -1},
		is:      []error{ErrInvalidOptions},
	}, {
		name:    "kernel without uprobe_multi",
		targets: []Target{{Path: path, Offsets: offsets}},
		opts:    &Options{Features: &kernelprobe.Features{Release: "6.1.0"}},
		is:      []error{ErrUprobeMultiUnsupported},
		says:    []string{"6.1.0"},
	}, {
		name:    "kernel without the pid-filter fix",
		targets: []Target{{Path: path, Offsets: offsets}},
		opts:    &Options{PID: os.Getpid(), Features: &kernelprobe.Features{Release: "6.8.0", UprobeMulti: true}},
		is:      []error{ErrPIDFilterUnsupported},
	}, {
		name:    "kernel without sessions",
		targets: []Target{{Path: path, Offsets: offsets}},
		opts:    &Options{Session: true, Features: &kernelprobe.Features{Release: "6.12.0", UprobeMulti: true}},
		is:      []error{ErrSessionUnsupported},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.session {
				f, _ := kernelprobe.Detect()
				testutil.RequireKernelFeature(t, f.UprobeSession, "uprobe sessions")
			}
			prog := tc.prog
			if prog == nil {
				prog = c.CountEntry
			}
			before := probetest.TakeSnapshot(t, prog)
			l, err := UprobeMulti(prog, tc.targets, tc.opts)
			if err == nil {
				l.Close()
				t.Fatal("no error")
			}
			t.Log(err)
			for _, want := range tc.is {
				if !errors.Is(err, want) {
					t.Errorf("error %q is not %v", err, want)
				}
			}
			for _, s := range tc.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
			before.Check(t, "after the failure")
		})
	}
}

func TestNotKprobe(t *testing.T) {
	if _, err := UprobeMulti(nil, nil, nil); !errors.Is(err, ErrWrongProgram) {
		t.Errorf("nil program: %v", err)
	}
}

// TestRefusedSiteNamed attaches sites of libc to a live process with one
// that the kernel refuses among them (pthread_spin_lock, which starts with
// a lock prefix): the link fails whole, and the error names that site, by
// index and offset, and wraps kernelprobe.ErrUnprobeable.
func TestRefusedSiteNamed(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("pthread_spin_lock starts with lock decl on x86-64")
	}
	_, _, c := setup(t, 5)
	lib, err := elfsym.LookPath("libc.so.6")
	if err != nil {
		t.Fatal(err)
	}
	f, err := elfsym.Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var offs []uint64
	for _, name := range []string{"malloc", "free", "pthread_spin_lock", "pthread_spin_init"} {
		sites, err := f.Resolve(name)
		if err != nil {
			t.Fatal(err)
		}
		offs = append(offs, sites[0].Offset)
	}
	cmd := exec.Command("sleep", "1000")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	time.Sleep(100 * time.Millisecond) // mapped libc by now
	l, err := UprobeMulti(c.CountEntry, []Target{{Path: lib, Offsets: offs}}, &Options{PID: cmd.Process.Pid})
	if err == nil {
		l.Close()
		t.Fatal("attached an instruction with a lock prefix")
	}
	if want := fmt.Sprintf("refused: #2 (offset %#x)", offs[2]); !errors.Is(err, kernelprobe.ErrUnprobeable) || !strings.Contains(err.Error(), want) {
		t.Errorf("%v\nwant it to wrap ErrUnprobeable and say %q", err, want)
	}
}

// TestLinksPinned: the kernel links are cilium/ebpf's uprobe_multi links,
// so pinning one keeps its sites counted after Close, and the pin taken
// back reports the same sites.
func TestLinksPinned(t *testing.T) {
	const n, calls = 100, 2
	path, offsets, c := setup(t, n)
	dir := testutil.BPFFS(t)
	l, err := UprobeMulti(c.CountEntry, []Target{{Path: path, Offsets: offsets}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kls := l.Links()
	if len(kls) != 1 {
		t.Fatalf("Links() has %d links, want 1", len(kls))
	}
	pin := filepath.Join(dir, "link")
	if err := kls[0].Pin(pin); err != nil {
		t.Fatal(err)
	}
	want, err := l.Info()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Close of a pinned link took %v: it waited for a link that stays", d)
	}
	run(t, path, n, calls)
	counts, err := testprogs.ReadArray(c.Counts, n)
	if err != nil {
		t.Fatal(err)
	}
	for i, got := range counts {
		if w := uint64(testprogs.ExpectedCalls(i, calls)); got != w {
			t.Fatalf("site %s after Close of the pinned link: %d calls, want %d", testprogs.FuncName(i), got, w)
		}
	}

	back, err := link.LoadPinnedLink(pin, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := infoOf(back)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != want[0].ID || !slices.Equal(got.Offsets, want[0].Offsets) || !slices.Equal(got.Cookies, want[0].Cookies) {
		t.Errorf("pinned link's info = ID %d with %d offsets, want ID %d with %d", got.ID, len(got.Offsets), want[0].ID, len(want[0].Offsets))
	}
	if err := back.Unpin(); err != nil {
		t.Fatal(err)
	}
	if err := back.Close(); err != nil {
		t.Fatal(err)
	}
	run(t, path, n, calls)
	again, err := testprogs.ReadArray(c.Counts, n)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(again, counts) {
		t.Error("sites still counted after Unpin and Close")
	}
}

// TestLoadPinned: Link.Pin and LoadPinned take a Link with a split target
// back whole, and refuse targets the pinned links do not hold.
func TestLoadPinned(t *testing.T) {
	const n, calls = 100, 2
	path, offsets, c := setup(t, n)
	defer func(old int) { sitesPerLink = old }(sitesPerLink)
	sitesPerLink = 30
	dir := testutil.BPFFS(t)
	l, err := UprobeMulti(c.CountEntry, []Target{{Path: path, Offsets: offsets}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Pin(dir); err != nil {
		t.Fatal(err)
	}
	want, err := l.Info()
	if err != nil {
		t.Fatal(err)
	}
	ts := l.Targets()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	wrong := ts.Clone()
	wrong[0].Offsets = slices.Clone(wrong[0].Offsets)
	wrong[0].Offsets[50]++
	if _, err := LoadPinned(dir, wrong); !errors.Is(err, ErrPinMismatch) {
		t.Errorf("LoadPinned with another offset: %v, want ErrPinMismatch", err)
	}
	back, err := LoadPinned(dir, ts)
	if err != nil {
		t.Fatal(err)
	}
	got, err := back.Info()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) || len(got) != 4 {
		t.Fatalf("taken back %d links, want %d (4)", len(got), len(want))
	}
	for i := range got {
		if got[i].ID != want[i].ID || got[i].First != want[i].First || !slices.Equal(got[i].Offsets, want[i].Offsets) {
			t.Errorf("link %d taken back as ID %d from site %d, want ID %d from %d", i, got[i].ID, got[i].First, want[i].ID, want[i].First)
		}
	}
	run(t, path, n, calls)
	counts, err := testprogs.ReadArray(c.Counts, n)
	if err != nil {
		t.Fatal(err)
	}
	for i, got := range counts {
		if w := uint64(testprogs.ExpectedCalls(i, calls)); got != w {
			t.Fatalf("site %s: %d calls, want %d", testprogs.FuncName(i), got, w)
		}
	}
	if err := back.Unpin(); err != nil {
		t.Fatal(err)
	}
	if err := back.Close(); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		// The kernel's own iterators (bpf_preload) are in every mount.
		if !strings.HasSuffix(e.Name(), ".debug") {
			t.Errorf("pin %s left after Unpin", e.Name())
		}
	}
}

// TestLeaveOutRefused: with LeaveOutRefused, the sites another tracer
// holds with another ref-counter offset (two in one kernel link of 7, one
// alone in another target) are left out, named by the caller's indexes,
// and every other site is attached and counted; a target whose only site
// is refused is left out whole. Without the option the call fails and
// leaves nothing.
func TestLeaveOutRefused(t *testing.T) {
	const n, calls = 20, 2 // (a size the VM runner prebuilds)
	path, offsets, c := setup(t, n)
	other := testprogs.PrivateCopy(t, path)
	defer func(old int) { sitesPerLink = old }(sitesPerLink)
	sitesPerLink = 7
	for _, at := range []struct {
		path string
		off  uint64
	}{{path, offsets[10]}, {path, offsets[12]}, {other, offsets[3]}} {
		closeFn, err := testprogs.ForeignUprobe(at.path, at.off, 6)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(closeFn)
	}
	before := probetest.TakeSnapshot(t, c.CountEntry)
	cookies := make([]uint64, n)
	for i := range cookies {
		cookies[i] = uint64(i)
	}
	targets := []Target{
		{Path: other, Offsets: offsets[3:4], Cookies: []uint64{1000}},
		{Path: path, Offsets: offsets, Cookies: cookies, Names: names(n)},
	}
	if _, err := UprobeMulti(c.CountEntry, targets, nil); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("without LeaveOutRefused: %v, want EINVAL", err)
	}
	before.Check(t, "after the failed attach")

	l, err := UprobeMulti(c.CountEntry, targets, &Options{LeaveOutRefused: true})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range l.Refused() {
		if !errors.Is(r.Err, unix.EINVAL) {
			t.Errorf("refusal %+v: want EINVAL", r)
		}
		got = append(got, fmt.Sprintf("%d/%d@%#x", r.Target, r.Site, r.Offset))
	}
	want := []string{fmt.Sprintf("0/0@%#x", offsets[3]), fmt.Sprintf("1/10@%#x", offsets[10]), fmt.Sprintf("1/12@%#x", offsets[12])}
	if !slices.Equal(got, want) {
		t.Errorf("refused %q, want %q", got, want)
	}
	ts := l.Targets()
	if len(ts) != 1 || len(ts[0].Offsets) != n-2 || l.Sites() != n-2 {
		t.Fatalf("attached %d targets, %d sites; want 1 target of %d", len(ts), l.Sites(), n-2)
	}
	// 7 sites a link: 0-6, then 7-13 less the two refused, then 14-19.
	if l.NumFDs() != 3 {
		t.Errorf("%d sites at 7 per link, 2 refused in the second: NumFDs() = %d, want 3", n-2, l.NumFDs())
	}
	infos, err := l.Info()
	if err != nil {
		t.Fatal(err)
	}
	var all []uint64
	for _, in := range infos {
		all = append(all, in.Offsets...)
	}
	if !slices.Equal(all, ts[0].Offsets) {
		t.Error("the links' offsets together are not the target's as attached")
	}
	run(t, path, n, calls)
	counts, _ := testprogs.ReadArray(c.Counts, n)
	for i := range n {
		want := uint64(testprogs.ExpectedCalls(i, calls))
		if i == 10 || i == 12 {
			want = 0
		}
		if counts[i] != want {
			t.Errorf("site %d: %d calls counted, want %d", i, counts[i], want)
		}
	}
	l.Close()
	before.Check(t, "after Close")
}
