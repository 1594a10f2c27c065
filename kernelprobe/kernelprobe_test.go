package kernelprobe_test

import (
	"errors"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/probetest"

	"github.com/cilium/ebpf"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"golang.org/x/sys/unix"
)

// kernelAtLeast reports whether the running kernel's release is at least
// major.minor.
func kernelAtLeast(t *testing.T, major, minor int) bool {
	t.Helper()
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		t.Fatal(err)
	}
	var ma, mi int
	rel := unix.ByteSliceToString(uts.Release[:])
	for i, part := range strings.SplitN(rel, ".", 3)[:2] {
		n := 0
		for _, c := range part {
			if c < '0' || c > '9' {
				break
			}
			n = n*10 + int(c-'0')
		}
		if i == 0 {
			ma = n
		} else {
			mi = n
		}
	}
	return ma > major || ma == major && mi >= minor
}

func TestDetect(t *testing.T) {
	probetest.RequireBPF(t)
	t.Setenv(kernelprobe.ForceEnv, "")
	kernelprobe.ResetForTest()

	f, err := kernelprobe.Detect()
	if err != nil {
		t.Fatal(err)
	}
	t.Log(f)
	if f.Release == "" {
		t.Error("empty Release")
	}
	// Each feature is expected from the kernel version that introduced it,
	// so the test checks the probes on whatever kernel runs it.
	for _, c := range []struct {
		name         string
		got          bool
		major, minor int
	}{
		{"UprobePMU", f.UprobePMU, 4, 17},
		{"RefCtrOffset", f.RefCtrOffset, 4, 20},
		{"Cookies", f.Cookies, 5, 15},
		{"UprobeMulti", f.UprobeMulti, 6, 6},
		{"UprobeMultiPIDFilter", f.UprobeMultiPIDFilter, 6, 10},
		{"UprobeSession", f.UprobeSession, 6, 13},
	} {
		if want := kernelAtLeast(t, c.major, c.minor); c.got != want {
			t.Errorf("%s = %v on %s, want %v (since %d.%d)", c.name, c.got, f.Release, want, c.major, c.minor)
		}
	}
	if want := kernelprobe.PathUprobeMulti; kernelAtLeast(t, 6, 6) && f.Path() != want {
		t.Errorf("Path() = %v, want %v", f.Path(), want)
	}
	checkStatedFeatures(t, f)

	// Cached: the same answer, from many goroutines at once.
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			g, err := kernelprobe.Detect()
			if err != nil || g != f {
				t.Errorf("cached kernelprobe.Detect() = %+v, %v; want %+v", g, err, f)
			}
		})
	}
	wg.Wait()
}

func all() kernelprobe.Features {
	return kernelprobe.Features{Release: "6.18.0", UprobeMulti: true, UprobeMultiPIDFilter: true, Cookies: true,
		RefCtrOffset: true, UprobeSession: true, UprobePMU: true}
}

func TestParseForce(t *testing.T) {
	for _, c := range []struct {
		in      string
		want    func(*kernelprobe.Features)
		wantErr bool
	}{
		{in: "", want: func(*kernelprobe.Features) {}},
		{in: " , ", want: func(*kernelprobe.Features) {}},
		{in: "fallback", want: func(f *kernelprobe.Features) {
			f.UprobeMulti, f.UprobeMultiPIDFilter, f.UprobeSession = false, false, false
		}},
		{in: "nopidfilter", want: func(f *kernelprobe.Features) { f.UprobeMultiPIDFilter = false }},
		// No kernel without cookies has uprobe_multi.
		{in: "nocookie, norefctr", want: func(f *kernelprobe.Features) {
			f.Cookies, f.RefCtrOffset = false, false
			f.UprobeMulti, f.UprobeMultiPIDFilter, f.UprobeSession = false, false, false
		}},
		{in: "nosession", want: func(f *kernelprobe.Features) { f.UprobeSession = false }},
		{in: "fallbak", wantErr: true},
		{in: "nocookie,FALLBACK", wantErr: true},
	} {
		apply, err := kernelprobe.ParseForce(c.in)
		if c.wantErr {
			if !errors.Is(err, kernelprobe.ErrBadForce) || !strings.Contains(err.Error(), kernelprobe.ForceEnv) {
				t.Errorf("ParseForce(%q) error = %v, want one naming %s and wrapping ErrBadForce", c.in, err, kernelprobe.ForceEnv)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseForce(%q): %v", c.in, err)
			continue
		}
		got, want := all(), all()
		apply(&got)
		c.want(&want)
		if got != want {
			t.Errorf("ParseForce(%q) gives %+v, want %+v", c.in, got, want)
		}
	}
}

func TestForceEnvAndOverride(t *testing.T) {
	probetest.RequireBPF(t)
	t.Setenv(kernelprobe.ForceEnv, "")
	base, err := kernelprobe.Detect()
	if err != nil {
		t.Fatal(err)
	}

	t.Setenv(kernelprobe.ForceEnv, "fallback,nocookie")
	f, err := kernelprobe.Detect()
	if err != nil {
		t.Fatal(err)
	}
	if f.UprobeMulti || f.Cookies || f.UprobeSession || f.UprobeMultiPIDFilter || f.Path() != kernelprobe.PathPerfEvent {
		t.Errorf("with %s=fallback,nocookie: %v", kernelprobe.ForceEnv, f)
	}
	if f.Release != base.Release || f.UprobePMU != base.UprobePMU {
		t.Errorf("forcing changed unrelated fields: %v vs %v", f, base)
	}

	t.Setenv(kernelprobe.ForceEnv, "bogus")
	if _, err := kernelprobe.Detect(); !errors.Is(err, kernelprobe.ErrBadForce) {
		t.Errorf("with %s=bogus: err = %v, want ErrBadForce", kernelprobe.ForceEnv, err)
	}

	t.Setenv(kernelprobe.ForceEnv, "")
	restore := kernelprobe.SetOverride(func(f *kernelprobe.Features) { f.UprobeMultiPIDFilter = false })
	f, err = kernelprobe.Detect()
	restore()
	if err != nil {
		t.Fatal(err)
	}
	want := base
	want.UprobeMultiPIDFilter = false
	if f != want {
		t.Errorf("with override: %v, want %v", f, want)
	}
	if f, _ := kernelprobe.Detect(); f != base {
		t.Errorf("after restore: %v, want %v", f, base)
	}
}

func TestPath(t *testing.T) {
	for _, c := range []struct {
		f    kernelprobe.Features
		want kernelprobe.Path
		str  string
	}{
		{kernelprobe.Features{UprobeMulti: true}, kernelprobe.PathUprobeMulti, "uprobe_multi"},
		{kernelprobe.Features{UprobePMU: true, Cookies: true}, kernelprobe.PathPerfEvent, "perf_event"},
		{kernelprobe.Features{}, kernelprobe.PathPerfEvent, "perf_event"},
	} {
		if got := c.f.Path(); got != c.want || got.String() != c.str {
			t.Errorf("%+v.Path() = %v (%q), want %v (%q)", c.f, got, got.String(), c.want, c.str)
		}
	}
	if s := kernelprobe.Path(0).String(); s != "Path(0)" {
		t.Errorf("Path(0).String() = %q", s)
	}
}

func TestPrepareProgramSpec(t *testing.T) {
	for _, c := range []struct {
		sec    string
		typ    ebpf.ProgramType
		at     ebpf.AttachType
		multi  ebpf.AttachType
		perfEv ebpf.AttachType
	}{
		{"uprobe", ebpf.Kprobe, 0, ebpf.AttachTraceUprobeMulti, 0},
		{"uretprobe", ebpf.Kprobe, 0, ebpf.AttachTraceUprobeMulti, 0},
		{"uprobe/bin:func", ebpf.Kprobe, 0, ebpf.AttachTraceUprobeMulti, 0},
		{"uprobe.s", ebpf.Kprobe, 0, ebpf.AttachTraceUprobeMulti, 0},
		{"usdt", ebpf.Kprobe, 0, ebpf.AttachTraceUprobeMulti, 0},
		{"uprobe.multi", ebpf.Kprobe, ebpf.AttachTraceUprobeMulti, ebpf.AttachTraceUprobeMulti, 0},
		{"uretprobe.multi/x", ebpf.Kprobe, ebpf.AttachTraceUprobeMulti, ebpf.AttachTraceUprobeMulti, 0},
		{"custom", ebpf.Kprobe, ebpf.AttachTraceUprobeMulti, ebpf.AttachTraceUprobeMulti, 0},
		// Left alone: sessions, kprobes, other program types.
		{"uprobe.session", ebpf.Kprobe, kernelprobe.AttachTraceUprobeSession, kernelprobe.AttachTraceUprobeSession, kernelprobe.AttachTraceUprobeSession},
		{"kprobe/do_sys_open", ebpf.Kprobe, 0, 0, 0},
		{"kprobe.multi", ebpf.Kprobe, ebpf.AttachTraceKprobeMulti, ebpf.AttachTraceKprobeMulti, ebpf.AttachTraceKprobeMulti},
		{"uprobes_are_not_this", ebpf.Kprobe, 0, 0, 0},
		{"socket", ebpf.SocketFilter, 0, 0, 0},
	} {
		for _, p := range []struct {
			path kernelprobe.Path
			want ebpf.AttachType
		}{{kernelprobe.PathUprobeMulti, c.multi}, {kernelprobe.PathPerfEvent, c.perfEv}, {0, c.at}} {
			spec := &ebpf.ProgramSpec{SectionName: c.sec, Type: c.typ, AttachType: c.at}
			cs := &ebpf.CollectionSpec{Programs: map[string]*ebpf.ProgramSpec{"p": spec.Copy()}}
			kernelprobe.PrepareProgramSpec(spec, p.path)
			kernelprobe.PrepareCollectionSpec(cs, p.path)
			if spec.AttachType != p.want || cs.Programs["p"].AttachType != p.want {
				t.Errorf("section %q attach %v on %v: got %v / %v, want %v",
					c.sec, c.at, p.path, spec.AttachType, cs.Programs["p"].AttachType, p.want)
			}
		}
	}
	kernelprobe.PrepareProgramSpec(nil, kernelprobe.PathUprobeMulti)    // must not panic
	kernelprobe.PrepareCollectionSpec(nil, kernelprobe.PathUprobeMulti) // must not panic
}

func BenchmarkDetect(b *testing.B) {
	probetest.RequireBPF(b)
	b.Setenv(kernelprobe.ForceEnv, "")
	b.Run("first", func(b *testing.B) {
		for b.Loop() {
			kernelprobe.ResetForTest()
			if _, err := kernelprobe.Detect(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("cached", func(b *testing.B) {
		for b.Loop() {
			if _, err := kernelprobe.Detect(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// FuzzParseForce checks that any MULTIPROBE_FORCE value either fails with
// kernelprobe.ErrBadForce or only ever switches features off.
func FuzzParseForce(f *testing.F) {
	for _, s := range []string{"", "fallback", "nocookie,nosession", " norefctr , nopidfilter ", "x", ",,"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		apply, err := kernelprobe.ParseForce(s)
		if err != nil {
			if !errors.Is(err, kernelprobe.ErrBadForce) {
				t.Fatalf("ParseForce(%q): %v does not wrap ErrBadForce", s, err)
			}
			return
		}
		got := all()
		apply(&got)
		if got.Release != "6.18.0" || !got.UprobePMU {
			t.Fatalf("ParseForce(%q) changed fields it has no word for: %+v", s, got)
		}
	})
}

// checkStatedFeatures fails t for every feature of f that differs from
// the statement in testutil.ExpectFeaturesEnv, if the run made one: a
// guest kernel that silently had more or less would test another path
// than the run means to, and tests skip for a lack the statement names.
func checkStatedFeatures(t *testing.T, f kernelprobe.Features) {
	t.Helper()
	stated := os.Getenv(testutil.ExpectFeaturesEnv)
	if stated == "" {
		return
	}
	have := map[string]bool{
		"uprobe_multi":            f.UprobeMulti,
		"uprobe_multi_pid_filter": f.UprobeMultiPIDFilter,
		"uprobe_session":          f.UprobeSession,
		"cookies":                 f.Cookies,
		"ref_ctr_offset":          f.RefCtrOffset,
		"uprobe_pmu":              f.UprobePMU,
	}
	for _, kv := range strings.Fields(stated) {
		name, val, ok := strings.Cut(kv, "=")
		got, known := have[name]
		if !ok || !known || (val != "0" && val != "1") {
			t.Errorf("%s: cannot read %q (want NAME=0 or NAME=1, NAME one of %v)", testutil.ExpectFeaturesEnv, kv, slices.Sorted(maps.Keys(have)))
			continue
		}
		if want := val == "1"; got != want {
			t.Errorf("kernel %s: %s is %v, but the run states %s (%s)", f.Release, name, got, kv, testutil.ExpectFeaturesEnv)
		}
	}
}
