package probetest_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/probetest"
)

// procState returns the state letter of /proc/PID/stat: 't' is stopped by
// a tracer.
func procState(t *testing.T, pid int) byte {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	_, after, _ := strings.Cut(string(b), ") ")
	return after[0]
}

func TestStart(t *testing.T) {
	probetest.RequireRoot(t)
	for _, tc := range []struct {
		script string
		status int
	}{
		{"exit 0", 0},
		{"exit 3", 3},
		{"kill -9 $$", 137},
	} {
		t.Run(tc.script, func(t *testing.T) {
			p := probetest.StartStopped(t, "/bin/sh", "-c", tc.script)
			if s := procState(t, p.PID()); s != 't' {
				t.Errorf("state %c after Start, want t (stopped by its tracer)", s)
			}
			if err := p.Resume(); err != nil {
				t.Fatal(err)
			}
			status, err := p.Wait()
			if err != nil || status != tc.status {
				t.Errorf("Wait = %d, %v; want %d", status, err, tc.status)
			}
		})
	}
}

func TestStartErrors(t *testing.T) {
	probetest.RequireRoot(t)
	if _, err := probetest.Start(exec.Command("/nonexistent/program")); err == nil {
		t.Error("Start of a missing program: no error")
	}
	p := probetest.StartStopped(t, "/bin/sh", "-c", "exit 0")
	if _, err := p.Wait(); err == nil {
		t.Error("Wait before Resume: no error")
	}
	p.Kill() // before Resume: the process must go
	<-p.Done()
}

func TestCBuild(t *testing.T) {
	t.Setenv(probetest.CacheDirEnv, t.TempDir())
	b := probetest.CBuild{
		Name:    "hello",
		Sources: map[string][]byte{"hello.c": []byte("#include \"msg.h\"\n#include <stdio.h>\nint main(void) { puts(MSG); return 0; }\n"), "msg.h": []byte("#define MSG \"hi\"\n")},
		Flags:   []string{"-O1"},
	}
	path := probetest.BuildC(t, b)
	out, err := exec.Command(path).Output()
	if err != nil || string(out) != "hi\n" {
		t.Fatalf("%s: %q, %v", path, out, err)
	}
	again, err := b.Build()
	if err != nil || again != path {
		t.Errorf("second Build = %q, %v; want the cached %q", again, err, path)
	}
	b.Flags = []string{"-O2"}
	if other, _ := b.Build(); other == path {
		t.Errorf("other flags, same path %s", other)
	}
	b.CC = "/nonexistent/cc"
	if _, err := b.Build(); !errors.Is(err, exec.ErrNotFound) {
		t.Errorf("missing compiler: %v, want exec.ErrNotFound", err)
	}
	b.CC, b.Sources["hello.c"] = "", []byte("int main(void) { return x; }\n")
	if _, err := b.Build(); err == nil || !strings.Contains(err.Error(), "undeclared") {
		t.Errorf("broken source: %v, want the compiler's message", err)
	}
}

// TestCheckCounts counts a generated target's calls on this kernel's path
// and checks them with CheckCounts, and its leaks with CheckLeaks.
func TestCheckCounts(t *testing.T) {
	probetest.RequireBPF(t)
	target := testprogs.PrivateTarget(t, 3)
	probes, err := multiprobe.ParseProbes("uprobe:"+target+":func_*", "uretprobe:"+target+":func_00001")
	if err != nil {
		t.Fatal(err)
	}
	p := probetest.StartStopped(t, target, "2")
	plan, err := multiprobe.Resolve(probes, &multiprobe.Options{PID: p.PID()})
	if err != nil {
		t.Fatal(err)
	}
	defer plan.Close()
	c := loadCounter(t, plan)
	t.Cleanup(func() { c.Close() }) // after CheckLeaks' check
	probetest.CheckLeaks(t, c.CountEntry, c.RecordReturn)
	entries, err := plan.Attach(c.CountEntry)
	if err != nil {
		t.Fatal(err)
	}
	defer entries.Close()
	if err := p.Resume(); err != nil {
		t.Fatal(err)
	}
	if status, err := p.Wait(); status != 0 || err != nil {
		t.Fatalf("target: %d, %v", status, err)
	}
	want := map[string]uint64{
		"func_00000":        uint64(testprogs.ExpectedCalls(0, 2)),
		"uprobe:func_00001": uint64(testprogs.ExpectedCalls(1, 2)),
		"func_00002":        uint64(testprogs.ExpectedCalls(2, 2)),
		// Attach attaches the one program to every site, the return too.
		"uretprobe:func_00001": uint64(testprogs.ExpectedCalls(1, 2)),
	}
	probetest.CheckCounts(t, plan.Sites(), c.Counts, want)

	got, err := probetest.ReadCounts(plan.Sites(), c.Counts)
	if err != nil {
		t.Fatal(err)
	}
	// ReadCounts keys as CheckCounts does: the same map, no difference.
	if diff := probetest.DiffCounts(got, want); diff != "" {
		t.Errorf("ReadCounts' map differs from CheckCounts' want:\n%s", diff)
	}
	want["func_00002"]++
	want["func_00001"] = 1
	want["uprobe:func_00000"] = 1
	want["nope"] = 1
	diff := probetest.DiffCounts(got, want)
	for _, line := range []string{
		"-\tfunc_00002: 5\n+\tfunc_00002: 4\n",
		"-\tfunc_00001: 1, but there is no such site (sites of 2 kinds have that name: give uprobe:func_00001 or uretprobe:func_00001)\n",
		"-\tuprobe:func_00000: 1, but there is no such site (its key is func_00000: the kind goes only before a name that two kinds share)\n",
		"-\tnope: 1, but there is no such site\n",
	} {
		if !strings.Contains(diff, line) {
			t.Errorf("diff lacks %q:\n%s", line, diff)
		}
	}
}

// recorder is a testing.TB whose errors and cleanups a test inspects.
type recorder struct {
	testing.TB
	errs     []string
	cleanups []func()
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}
func (r *recorder) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }
func (r *recorder) Failed() bool     { return len(r.errs) > 0 }

// TestCheckLeaksFinds leaves a link attached and an fd open, and expects
// CheckLeaks to say so.
func TestCheckLeaksFinds(t *testing.T) {
	probetest.RequireBPF(t)
	target := testprogs.PrivateTarget(t, 3)
	probes, err := multiprobe.ParseProbes("uprobe:" + target + ":func_*")
	if err != nil {
		t.Fatal(err)
	}
	plan, err := multiprobe.Resolve(probes, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer plan.Close()
	c := loadCounter(t, plan)
	defer c.Close()
	rec := &recorder{TB: t}
	probetest.CheckLeaks(rec, c.CountEntry)
	l, err := plan.Attach(c.CountEntry)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, fn := range rec.cleanups {
		fn()
	}
	all := strings.Join(rec.errs, "\n")
	// Without BPF cookies the links are the per-site copies', which the
	// copies' fds stand for.
	if !strings.Contains(all, "more than when CheckLeaks") || l.NumClones() == 0 && !strings.Contains(all, "kernel links") {
		t.Errorf("CheckLeaks with a link attached said:\n%s", all)
	}
}

// TestExample runs the package example's test with the counter program of
// multiprobe's own tests.
func TestExample(t *testing.T) {
	spec, err := testprogs.CounterSpec()
	if err != nil {
		t.Fatal(err)
	}
	testCountWork(t, spec)
}

// loadCounter loads the counter programs of multiprobe's tests for plan.
func loadCounter(t *testing.T, plan *multiprobe.Plan) *testprogs.Counter {
	t.Helper()
	spec, err := testprogs.CounterSpec()
	if err != nil {
		t.Fatal(err)
	}
	if err := plan.Prepare(spec); err != nil {
		t.Fatal(err)
	}
	c, err := testprogs.NewCounter(spec)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// leakChildEnv makes TestCheckLeaksLine, run again by itself, leak a file
// descriptor after CheckLeaks and print the line of that call.
const leakChildEnv = "PROBETEST_LEAK_CHILD"

// TestCheckLeaksLine wants CheckLeaks' report at the line of the test that
// called it, where a user looks, not at a line of package probetest.
func TestCheckLeaksLine(t *testing.T) {
	if os.Getenv(leakChildEnv) == "1" {
		_, _, line, _ := runtime.Caller(0)
		probetest.CheckLeaks(t)
		fmt.Printf("CheckLeaks at line %d\n", line+1)
		if _, err := os.Open("/dev/null"); err != nil { // left open
			t.Fatal(err)
		}
		return
	}
	probetest.RequireRoot(t) // CheckLeaks lists the kernel's links
	cmd := exec.Command(os.Args[0], "-test.run=^TestCheckLeaksLine$", "-test.v")
	cmd.Env = append(os.Environ(), leakChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the leaking test passed:\n%s", out)
	}
	var line int
	_, at, _ := strings.Cut(string(out), "CheckLeaks at line ")
	if _, err := fmt.Sscanf(at, "%d", &line); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	want := fmt.Sprintf("probetest_test.go:%d: when the test ended: ", line)
	if !strings.Contains(string(out), want) {
		t.Errorf("CheckLeaks did not report at the test's line (want %q):\n%s", want, out)
	}
}
