package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/load"
	"github.com/multiprobe/multiprobe/probetest"
)

const (
	loadTestObject = "../../load/testdata/multi.o"
	loadTestBroken = "../../load/testdata/multi_broken.o"
)

var loadTestPrograms = []string{"on_call", "count_packets", "on_nanosleep", "on_getpid", "tail_target"}

func TestLoadUsage(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		code     int
		contains string
	}{
		{"no object", []string{"load"}, 2, "need exactly one BPF object"},
		{"two objects", []string{"load", "a.o", "b.o"}, 2, "need exactly one BPF object"},
		{"bad order", []string{"load", "--order", "random", loadTestObject}, 2, `unknown load order "random"`},
		{"negative jobs", []string{"load", "--jobs", "-1", loadTestObject}, 2, "--jobs -1"},
		{"missing file", []string{"load", "/nonexistent/x.o"}, 1, "/nonexistent/x.o"},
		{"not BPF", []string{"load", "/bin/sh"}, 1, "read BPF object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(tt.args, &stdout, &stderr)
			if code != tt.code || !strings.Contains(stderr.String(), tt.contains) {
				t.Errorf("exit %d, stderr %q; want exit %d mentioning %q", code, stderr.String(), tt.code, tt.contains)
			}
		})
	}
}

func TestLoadTable(t *testing.T) {
	probetest.RequireBPF(t)
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	var stdout, stderr bytes.Buffer
	if code := run([]string{"load", "--jobs", "2", loadTestObject}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	out := stdout.String()
	for _, want := range append([]string{"RANK", "VERIFIED", "timeline", "worker 0", "sequential (sum of loads)", "concurrent makespan", "lower bound (2 CPUs)", "5 programs (0 failed)"}, loadTestPrograms...) {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// Zero-sized maps got defaults, and the command said so.
	for _, want := range []string{"map seen: max_entries 0, using 1", "map events: max_entries 0, using"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q: %s", want, stderr.String())
		}
	}
	// The costliest program (a loop, few instructions) ranks first: LPT by
	// instruction count says on_call, 30 instructions, is the longest.
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "0 ") && !strings.Contains(line, "on_call") {
			t.Errorf("rank 0 is %q, want on_call", line)
		}
	}
}

func loadJSON(t *testing.T, args ...string) (*load.Profile, int, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(append([]string{"load", "--json"}, args...), &stdout, &stderr)
	var got struct {
		Object  string
		Profile struct {
			load.Profile
		}
	}
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatalf("exit %d, bad JSON %v: %s\nstderr: %s", code, err, stdout.String(), stderr.String())
	}
	return &got.Profile.Profile, code, stderr.String()
}

func TestLoadJSONAndCachedOrder(t *testing.T) {
	probetest.RequireBPF(t)
	t.Setenv("XDG_CACHE_HOME", t.TempDir())

	prof, code, stderr := loadJSON(t, "--jobs", "2", "--order", "given", loadTestObject)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if prof.Jobs != 2 || prof.Order != load.OrderGiven || len(prof.Programs) != len(loadTestPrograms) {
		t.Fatalf("profile: jobs %d order %v, %d programs", prof.Jobs, prof.Order, len(prof.Programs))
	}
	counted := testutil.KernelCountsVerified(t)
	for _, pp := range prof.Programs {
		// The kernel's own count of the instructions it verified, where
		// it keeps one (Linux 5.16).
		if (counted && pp.Verified == 0) || pp.Error != "" || pp.Cached {
			t.Errorf("%s: verified %d, error %q, cached %v", pp.Name, pp.Verified, pp.Error, pp.Cached)
		}
	}
	if prof.Makespan < prof.LowerBound || prof.Work < prof.Longest {
		t.Errorf("makespan %v < bound %v or work %v < longest %v", prof.Makespan, prof.LowerBound, prof.Work, prof.Longest)
	}

	// The first run recorded every program's cost; the second orders by it.
	prof, code, stderr = loadJSON(t, "--order", "cached", loadTestObject)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, pp := range prof.Programs {
		if !pp.Cached {
			t.Errorf("%s was not ordered from the cost cache", pp.Name)
		}
		if pp.Name == "on_call" && pp.Rank != 0 {
			t.Errorf("on_call, the costliest, has rank %d", pp.Rank)
		}
	}
}

func TestLoadFailuresReported(t *testing.T) {
	probetest.RequireBPF(t)
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	var stdout, stderr bytes.Buffer
	if code := run([]string{"load", loadTestBroken}, &stdout, &stderr); code != 1 {
		t.Fatalf("exit %d, want 1: %s", code, stderr.String())
	}
	// The profile of the others is printed in full...
	if !strings.Contains(stdout.String(), "6 programs (1 failed)") || !strings.Contains(stdout.String(), "FAILED") {
		t.Errorf("table does not report the failure:\n%s", stdout.String())
	}
	// ...and the failure with its verifier log.
	for _, want := range []string{"1 of 6 programs failed to load", "program reads_data:", "verifier log of program reads_data:", "invalid bpf_context access"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
		}
	}

	prof, code, _ := loadJSON(t, loadTestBroken)
	if code != 1 || prof.Failed() != 0 { // Err is not in JSON; Error is
		t.Fatalf("exit %d", code)
	}
	n := 0
	for _, pp := range prof.Programs {
		if pp.Error != "" {
			n++
			if pp.Name != "reads_data" || pp.Attempts != 2 {
				t.Errorf("%s failed after %d attempts: %s", pp.Name, pp.Attempts, pp.Error)
			}
		}
	}
	if n != 1 {
		t.Errorf("%d programs with errors in JSON, want 1", n)
	}
}

// TestLoadCostCacheRefusesDevice checks that --cost-cache naming a device
// node fails before anything loads and leaves the node as it was (it used
// to be replaced by a regular file).
func TestLoadCostCacheRefusesDevice(t *testing.T) {
	probetest.RequireRoot(t)
	dev := filepath.Join(t.TempDir(), "null")
	// A copy of /dev/null's node, never the real one.
	if err := unix.Mknod(dev, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := run([]string{"load", "--cost-cache", dev, loadTestObject}, &stdout, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), "is a character device, not a regular file") {
		t.Errorf("exit %d, stderr %q; want exit 1 naming the character device", code, stderr.String())
	}
	var st unix.Stat_t
	if err := unix.Lstat(dev, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR {
		t.Errorf("device node changed: mode %#o, err %v", st.Mode, err)
	}
}

// unprivEnv makes the test binary, started again as nobody by
// TestLoadUnprivileged, run `load` and print what it says.
const unprivEnv = "MULTIPROBE_CLI_UNPRIVILEGED"

// TestLoadUnprivileged runs `load` as an unprivileged user: the error must
// name the missing capability, not the memlock rlimit that cilium/ebpf
// suggests for every EPERM.
func TestLoadUnprivileged(t *testing.T) {
	if os.Geteuid() != 0 {
		probetest.Unavailable(t, "needs root to start a process as nobody")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// Not t.TempDir(): its parent is closed to other users.
	dir, err := os.MkdirTemp("", "multiprobe-cli-unpriv")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	data, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "cli.test")
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	obj := filepath.Join(dir, "multi.o")
	if data, err = os.ReadFile(loadTestObject); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(obj, data, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), unprivEnv+"="+obj, "HOME="+dir, "GOCOVERDIR="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, _ := cmd.CombinedOutput()
	if !strings.Contains(string(out), "CAP_BPF") || strings.Contains(string(out), "MEMLOCK") {
		t.Errorf("load as nobody said:\n%s\nwant it to name CAP_BPF, not MEMLOCK", out)
	}
}
