package usdt

//go:generate clang-19 -O2 -g -fdebug-compilation-dir=. -Wall -Werror -target bpfel -D__TARGET_ARCH_x86 -I../bpf -c testdata/usdt_test.bpf.c -o testdata/usdt_test_x86_bpfel.o
//go:generate llvm-strip-19 -g testdata/usdt_test_x86_bpfel.o
//go:generate clang-19 -O2 -g -fdebug-compilation-dir=. -Wall -Werror -target bpfel -D__TARGET_ARCH_arm64 -I../bpf -c testdata/usdt_test.bpf.c -o testdata/usdt_test_arm64_bpfel.o
//go:generate llvm-strip-19 -g testdata/usdt_test_arm64_bpfel.o

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"

	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/probetest"
)

// event mirrors struct event of testdata/usdt_test.bpf.c.
type event struct {
	IP        uint64
	Cookie    uint32
	Cnt       int32
	Err       [MaxArgs]int32
	Size      [MaxArgs]int32
	Val       [MaxArgs]int64
	Named     [3]int64
	FromMacro int32
	_         int32
}

// u64Value is the uint64 18000000000000000000 as BPF's long holds it.
var u64Value = func() int64 { u := uint64(18000000000000000000); return int64(u) }()

// expected returns the argument values probes.c and libmptest.c pass to
// a probe; nil for the probes checked separately (sib, inlined).
func expected(probe string) []int64 {
	sizes := []int64{-5, 200, -30000, 60000, -2000000000, 4000000000, -9000000000000000000, u64Value}
	switch probe {
	case "sizes", "consts":
		return sizes
	case "twelve":
		var v []int64
		for i := range int64(12) {
			v = append(v, -9000000000000000000/(i+1)+i)
		}
		return v
	case "structp":
		return []int64{-123456789012345, -42, 999}
	case "global":
		return []int64{-77}
	case "sema":
		return []int64{7}
	case "libprobe":
		return []int64{-1234567, 0xdeadbeefcafe}
	}
	return nil
}

// hitCounts is how often one run of probes fires each probe.
var hitCounts = map[string]int{
	"sizes": 1, "consts": 1, "twelve": 1, "structp": 1, "sib": 4, "global": 1,
	"inlined": inlineSites, "sema": 1, "libprobe": 1,
}

// fixture is the test BPF object, loaded.
type fixture struct {
	coll     *ebpf.Collection
	rd       *ringbuf.Reader
	features kernelprobe.Features
}

// loadFixture loads the test object. Its programs find their site's spec
// through the BPF cookie, so a kernel without cookies (before 5.15) skips
// these tests, where it says it lacks them: the root package's tests cover
// USDT there, with a copy of the program per site.
func loadFixture(t *testing.T) *fixture {
	t.Helper()
	probetest.RequireBPF(t)
	f, err := kernelprobe.Detect()
	if err != nil {
		t.Fatal(err)
	}
	testutil.RequireKernelFeature(t, f.Cookies, "BPF cookies")
	cs, err := ebpf.LoadCollectionSpec(testObject)
	if err != nil {
		t.Fatal(err)
	}
	if err := ConfigureCollection(cs, CollectionOptions{}); err != nil {
		t.Fatal(err)
	}
	coll, err := ebpf.NewCollection(cs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(coll.Close)
	rd, err := ringbuf.NewReader(coll.Maps["events"])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rd.Close() })
	return &fixture{coll: coll, rd: rd, features: f}
}

// heldSpecs counts the spec map's entries that someone holds.
func (fx *fixture) heldSpecs(t *testing.T) int {
	t.Helper()
	_, refs, err := readSpecs(fx.coll.Maps[SpecMapName])
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, r := range refs {
		if r > 0 {
			n++
		}
	}
	return n
}

// target is a probe selected for a test: its file and the user cookie
// that identifies it in events.
type target struct {
	file  *File
	probe Probe
}

// selectProbes opens path and returns its probes matching pattern, minus
// those named in skip.
func selectProbes(t *testing.T, path, pattern string, skip ...string) []target {
	t.Helper()
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	probes, err := f.Probes(pattern)
	if err != nil {
		t.Fatal(err)
	}
	var out []target
	for _, p := range probes {
		if !slices.Contains(skip, p.Name) {
			out = append(out, target{f, p})
		}
	}
	return out
}

type attachMode int

const (
	modeMulti    attachMode = iota // one uprobe_multi link per binary, cookies
	modeFallback                   // one perf-event uprobe per site, cookies
)

// attach attaches prog to every site of targets (all in one binary), the
// cookie's user half being base+index in targets, and returns a function
// that detaches and releases the spec ids.
func (fx *fixture) attach(t *testing.T, prog *ebpf.Program, targets []target, userBase uint32, mode attachMode, pid int) func() {
	t.Helper()
	var (
		offsets, refs []uint64
		specs         []Spec
		users         []uint32
	)
	for i, tg := range targets {
		for _, s := range tg.probe.Sites {
			spec, err := tg.file.Spec(s)
			if err != nil {
				t.Fatal(err)
			}
			specs = append(specs, spec)
			users = append(users, userBase+uint32(i))
			offsets = append(offsets, s.Offset)
			refs = append(refs, s.SemaphoreOffset)
		}
	}
	ids, err := AcquireSpecs(fx.coll.Maps[SpecMapName], specs)
	if err != nil {
		t.Fatal(err)
	}
	cookies := make([]uint64, len(specs))
	for i, id := range ids.IDs() {
		cookies[i] = PackCookie(id, users[i])
	}
	release := func() {
		if err := ids.Release(); err != nil {
			t.Error(err)
		}
	}
	ex, err := link.OpenExecutable(targets[0].file.Path)
	if err != nil {
		t.Fatal(err)
	}
	var links []link.Link
	switch mode {
	case modeMulti:
		opts := &link.UprobeMultiOptions{Addresses: offsets, RefCtrOffsets: refs, PID: uint32(pid), Cookies: cookies}
		l, err := ex.UprobeMulti(nil, prog, opts)
		if err != nil {
			release()
			t.Fatalf("uprobe_multi on %s: %v", targets[0].file.Path, err)
		}
		links = append(links, l)
	case modeFallback:
		for i := range offsets {
			l, err := ex.Uprobe("usdt", prog, &link.UprobeOptions{Address: offsets[i], RefCtrOffset: refs[i], Cookie: cookies[i], PID: pid})
			if err != nil {
				for _, l := range links {
					l.Close()
				}
				release()
				t.Fatalf("uprobe at %#x: %v", offsets[i], err)
			}
			links = append(links, l)
		}
	}
	return func() {
		for _, l := range links {
			l.Close()
		}
		release()
	}
}

// drain returns every event in the ring buffer.
func (fx *fixture) drain(t *testing.T) []event {
	t.Helper()
	var evs []event
	for {
		fx.rd.SetDeadline(time.Now().Add(100 * time.Millisecond))
		rec, err := fx.rd.Read()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return evs
		}
		if err != nil {
			t.Fatal(err)
		}
		var ev event
		if err := binary.Read(bytes.NewReader(rec.RawSample), binary.NativeEndian, &ev); err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
	}
}

// check compares every event with what the target passed: argument
// count, sizes, and each value as read in BPF.
func check(t *testing.T, evs []event, targets []target) {
	t.Helper()
	hits := make(map[string]int)
	inlined := make(map[int64]int)
	sibSeen := make(map[int64]bool)
	for _, ev := range evs {
		if int(ev.Cookie) >= len(targets) {
			t.Errorf("event with user cookie %d, %d probes attached", ev.Cookie, len(targets))
			continue
		}
		p := targets[ev.Cookie].probe
		hits[p.Name]++
		want := expected(p.Name)
		n := len(p.Sites[0].Args)
		if int(ev.Cnt) != n {
			t.Errorf("%s: arg count %d, want %d", &p, ev.Cnt, n)
			continue
		}
		for i := range MaxArgs {
			switch {
			case i >= n:
				if ev.Err[i] != -2 || ev.Size[i] != -2 {
					t.Errorf("%s: arg %d of %d: err %d size %d, want -ENOENT", &p, i, n, ev.Err[i], ev.Size[i])
				}
			case ev.Err[i] != 0:
				t.Errorf("%s: arg %d: error %d", &p, i, ev.Err[i])
			case int(ev.Size[i]) != p.Sites[0].Args[i].Size:
				t.Errorf("%s: arg %d: size %d, want %d", &p, i, ev.Size[i], p.Sites[0].Args[i].Size)
			case want != nil && ev.Val[i] != want[i]:
				t.Errorf("%s: arg %d (%s): %d, want %d", &p, i, p.Sites[0].Args[i].Spec, ev.Val[i], want[i])
			}
		}
		switch p.Name {
		case "inlined":
			inlined[ev.Val[0]]++
		case "sib":
			// arr[i] with arr = {10, -11, 12, -13, ...}.
			i := ev.Val[1]
			w := 10 + i
			if i%2 == 1 {
				w = -w
			}
			if ev.Val[0] != w {
				t.Errorf("%s: array[%d] read as %d, want %d", &p, i, ev.Val[0], w)
			}
			sibSeen[i] = true
		}
	}
	for _, tg := range targets {
		if got, want := hits[tg.probe.Name], hitCounts[tg.probe.Name]; got != want {
			t.Errorf("%s: %d hits, want %d", &tg.probe, got, want)
		}
	}
	if hits["inlined"] > 0 {
		for v := range int64(inlineSites) {
			if inlined[v] != 1 {
				t.Errorf("mptest:inlined: value %d seen %d times", v, inlined[v])
			}
		}
	}
	if hits["sib"] > 0 && len(sibSeen) != 4 {
		t.Errorf("mptest:sib: indexes %v", sibSeen)
	}
}

func run(t *testing.T, path string) {
	t.Helper()
	if out, err := exec.Command(path).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", path, err, out)
	}
}

// TestAttachMulti attaches one uprobe_multi link per binary with cookies
// (the executable at -O2 and -O0, and the shared library with no pid),
// runs the target and checks every argument of every hit.
func TestAttachMulti(t *testing.T) {
	tg := buildTargets(t)
	for _, exe := range []string{tg.exe, tg.exeO0} {
		t.Run(exe[strings.LastIndexByte(exe, '/')+1:], func(t *testing.T) {
			fx := loadFixture(t)
			testutil.RequireKernelFeature(t, fx.features.UprobeMulti, "uprobe_multi")
			prog := fx.coll.Programs["record"]
			exeTargets := selectProbes(t, exe, "mptest:*")
			libTargets := selectProbes(t, tg.lib, "*")
			all := append(slices.Clone(exeTargets), libTargets...)
			detachExe := fx.attach(t, prog, exeTargets, 0, modeMulti, 0)
			detachLib := fx.attach(t, prog, libTargets, uint32(len(exeTargets)), modeMulti, 0)
			run(t, exe)
			detachExe()
			detachLib()
			evs := fx.drain(t)
			check(t, evs, all)
			if n := fx.heldSpecs(t); n != 0 {
				t.Errorf("%d spec ids still held after detach", n)
			}
			// Detached: another run must not fire.
			run(t, exe)
			if evs := fx.drain(t); len(evs) != 0 {
				t.Errorf("%d events after detach", len(evs))
			}
		})
	}
}

// TestAttachFallback uses one perf-event uprobe per site. The inlined
// probe is left out: closing 300 perf uprobes takes half a minute.
func TestAttachFallback(t *testing.T) {
	tg := buildTargets(t)
	fx := loadFixture(t)
	prog := fx.coll.Programs["record_single"]
	exeTargets := selectProbes(t, tg.exe, "mptest:*", "inlined")
	libTargets := selectProbes(t, tg.lib, "*")
	detachExe := fx.attach(t, prog, exeTargets, 0, modeFallback, 0)
	detachLib := fx.attach(t, prog, libTargets, uint32(len(exeTargets)), modeFallback, 0)
	run(t, tg.exe)
	detachExe()
	detachLib()
	check(t, fx.drain(t), append(exeTargets, libTargets...))
}

// TestMacro checks MP_USDT's named, typed arguments against the values
// mptest:structp passes.
func TestMacro(t *testing.T) {
	tg := buildTargets(t)
	fx := loadFixture(t)
	testutil.RequireKernelFeature(t, fx.features.UprobeMulti, "uprobe_multi") // the program is uprobe.multi
	targets := selectProbes(t, tg.exe, "mptest:structp")
	detach := fx.attach(t, fx.coll.Programs["named"], targets, 0, modeMulti, 0)
	run(t, tg.exe)
	detach()
	evs := fx.drain(t)
	if len(evs) != 1 || evs[0].FromMacro != 1 {
		t.Fatalf("%d events: %+v", len(evs), evs)
	}
	if want := [3]int64{-123456789012345, -42, 999}; evs[0].Named != want {
		t.Fatalf("named args %v, want %v", evs[0].Named, want)
	}
}

// TestSemaphore proves the kernel counts the semaphore, on the kernel's
// attach path (uprobe_multi, or perf-event uprobes before 6.6): it reads it
// in the target's memory before attaching (0), while attached (at least
// 1), and after detaching (0), and checks that the guarded probe then
// fires exactly while attached.
func TestSemaphore(t *testing.T) {
	tg := buildTargets(t)
	fx := loadFixture(t)
	cmd := exec.Command(tg.exe, "wait")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close()
		cmd.Wait()
	}()
	out := bufio.NewScanner(stdout)
	line := func() string {
		if !out.Scan() {
			t.Fatalf("target ended: %v", out.Err())
		}
		return out.Text()
	}
	addr, err := strconv.ParseUint(strings.TrimPrefix(line(), "0x"), 16, 64)
	if err != nil {
		t.Fatal(err)
	}
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	sema := func() uint16 {
		var b [2]byte
		if _, err := mem.ReadAt(b[:], int64(addr)); err != nil {
			t.Fatalf("reading the semaphore at %#x: %v", addr, err)
		}
		return binary.NativeEndian.Uint16(b[:])
	}
	// poke makes the target fire the probe if the semaphore is set, then
	// report the semaphore as it saw it.
	poke := func() string {
		fmt.Fprintln(stdin)
		return line()
	}

	if v := sema(); v != 0 {
		t.Fatalf("semaphore %d before attaching", v)
	}
	targets := selectProbes(t, tg.exe, "mptest:sema")
	if targets[0].probe.SemaphoreOffset == 0 {
		t.Fatal("mptest:sema has no semaphore")
	}
	// The kernel counts the semaphore on both paths (ref_ctr_offset).
	prog, mode := fx.coll.Programs["record"], modeMulti
	if !fx.features.UprobeMulti {
		prog, mode = fx.coll.Programs["record_single"], modeFallback
	}
	detach := fx.attach(t, prog, targets, 0, mode, cmd.Process.Pid)
	if v := sema(); v < 1 {
		t.Fatalf("semaphore %d while attached", v)
	}
	if seen := poke(); seen == "0" {
		t.Fatalf("target sees semaphore %s while attached", seen)
	}
	detach()
	if v := sema(); v != 0 {
		t.Fatalf("semaphore %d after detaching", v)
	}
	if seen := poke(); seen != "0" {
		t.Fatalf("target sees semaphore %s after detaching", seen)
	}
	check(t, fx.drain(t), targets)
}
