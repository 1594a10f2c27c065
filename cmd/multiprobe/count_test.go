package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/multiprobe/multiprobe/elfsym"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/probetest"
	"golang.org/x/sys/unix"
)

func runCLI(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var o, e bytes.Buffer
	code = run(args, &o, &e)
	return o.String(), e.String(), code
}

// TestCount runs a generated target under `count` and checks the printed
// counts against the calls the target makes.
func TestCount(t *testing.T) {
	probetest.RequireBPF(t)
	const n, calls = 20, 2 // (a size the VM runner prebuilds)
	target := testprogs.PrivateTarget(t, n)
	out, errOut, code := runCLI(t, "count", "--json", "--stats", "uprobe:"+target+":func_*", "--", target, fmt.Sprint(calls))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var r countReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if r.Sites != n || r.Called != n {
		t.Fatalf("report: %d sites, %d called; want %d", r.Sites, r.Called, n)
	}
	var total uint64
	for _, c := range r.Counts {
		var i int
		fmt.Sscanf(c.Function, "func_%05d", &i)
		if want := uint64(testprogs.ExpectedCalls(i, calls)); c.Calls != want {
			t.Errorf("%s: %d calls, want %d", c.Function, c.Calls, want)
		}
		total += c.Calls
	}
	if r.Stats == nil || r.Stats.Runs != total {
		t.Errorf("stats %+v: want %d runs, one per counted call", r.Stats, total)
	}

	// The table form.
	out, errOut, code = runCLI(t, "count", "uprobe:"+target+":func_0000[0-2]", "--", target, "1")
	if code != 0 || !strings.Contains(out, "func_00002") || !strings.Contains(out, "calls to 3 of 3 sites") {
		t.Errorf("exit %d, output:\n%s%s", code, out, errOut)
	}
}

// TestCountTable checks the forms of count's report: a row per kind and
// function, --top, JSON without nulls, and --duration in plain seconds.
func TestCountTable(t *testing.T) {
	probetest.RequireBPF(t)
	const n = 5
	target := testprogs.PrivateTarget(t, n)
	entry, ret := "uprobe:"+target+":func_*", "uretprobe:"+target+":func_*"
	out, errOut, code := execCLI(t, "count", entry, ret, "--", target, "2")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for i := range n {
		for _, kind := range []string{"uprobe", "uretprobe"} {
			row := fmt.Sprintf("%d  %-9s  func_%05d\n", testprogs.ExpectedCalls(i, 2), kind, i)
			if !strings.Contains(out, row) {
				t.Errorf("no row %q in:\n%s", row, out)
			}
		}
	}
	if !strings.Contains(out, "CALLS  KIND       FUNCTION\n") {
		t.Errorf("no header CALLS KIND FUNCTION:\n%s", out)
	}

	out, errOut, code = execCLI(t, "count", "--top", "3", entry, ret, "--", target, "2")
	if rows := strings.Count(out, "  func_"); code != 0 || rows != 3 || !strings.Contains(out, "(7 more sites called, left out by --top)") {
		t.Errorf("--top 3: exit %d, %d rows:\n%s%s", code, rows, out, errOut)
	}

	// Nothing called: counts is [], not null. (Through --pid, not
	// following every process, which TestCountFollow tests.)
	idle := testprogs.Start(t, target, "-wait", "1")
	out, errOut, code = execCLI(t, "count", "--json", "--duration", "0.2", "--pid", strconv.Itoa(idle.PID()), "uprobe:"+target+":func_00001")
	if code != 0 || !strings.Contains(out, `"counts": []`) {
		t.Errorf("--json, nothing called: exit %d:\n%s%s", code, out, errOut)
	}
	for _, bad := range []string{"x", "-1", "0", "NaN"} {
		if _, errOut, code := execCLI(t, "count", "--duration", bad, entry); code != 2 {
			t.Errorf("--duration %s: exit %d, want 2: %s", bad, code, errOut)
		}
	}
}

// TestCountUprobeArgs prints a uprobe's integer arguments and a
// uretprobe's return value: the target calls func_00001(arg) with arg 0,
// 1, 2 and it returns arg*2+1.
func TestCountUprobeArgs(t *testing.T) {
	probetest.RequireBPF(t)
	target := testprogs.PrivateTarget(t, 5)
	fn := testprogs.FuncName(1)
	out, errOut, code := execCLI(t, "count", "--args", "--nargs", "1", "uprobe:"+target+":"+fn, "uretprobe:"+target+":"+fn, "--", target, "2")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for arg := range testprogs.ExpectedCalls(1, 2) {
		for _, line := range []string{
			fmt.Sprintf("%s %d\n", fn, arg),
			fmt.Sprintf("%s returned %d\n", fn, testprogs.ExpectedReturn(1, uint64(arg))),
		} {
			if !strings.Contains(out, line) {
				t.Errorf("output lacks %q:\n%s", line, out)
			}
		}
	}
	if _, errOut, code := execCLI(t, "count", "--args", "--nargs", "7", "uprobe:"+target+":"+fn); code != 2 {
		t.Errorf("--nargs 7: exit %d, want 2: %s", code, errOut)
	}
}

// TestCountGoArgs prints a Go function's arguments from the registers of
// Go's calling convention, and its result: the Go target calls Leaf(i) for
// i from 0, and Leaf returns i*2+1.
func TestCountGoArgs(t *testing.T) {
	probetest.RequireBPF(t)
	target := testprogs.GoTarget(t, false)
	out, errOut, code := execCLI(t, "count", "--args", "--nargs", "2", "uprobe:"+target+":main.Leaf", "uretprobe:"+target+":main.Leaf", "--", target, "1", "1", "3")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for i := range 3 {
		// The second register holds whatever it held: only the first
		// is Leaf's.
		for _, line := range []string{fmt.Sprintf("main.Leaf %d ", i), fmt.Sprintf("main.Leaf returned %d\n", 2*i+1)} {
			if !strings.Contains(out, line) {
				t.Errorf("output lacks %q:\n%s", line, out)
			}
		}
	}
}

// TestCountUSDT counts USDT probes and prints their arguments.
func TestCountUSDT(t *testing.T) {
	probetest.RequireBPF(t)
	target := testprogs.USDTTarget(t)
	out, errOut, code := runCLI(t, "count", "--args", "usdt:"+target+":mp:tick", "--", target, "3")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for i := 0; i < 3; i++ {
		if line := fmt.Sprintf("mp:tick %d %d\n", i, -3*i); !strings.Contains(out, line) {
			t.Errorf("output lacks %q:\n%s", line, out)
		}
	}
	out, errOut, code = runCLI(t, "count", "usdt:"+target+":mp:*", "--", target, "4")
	if code != 0 || !strings.Contains(out, "50  usdt  mp:inlined") || !strings.Contains(out, "4  usdt  mp:guarded") {
		t.Errorf("exit %d, output:\n%s%s", code, out, errOut)
	}
}

// TestCountStrings prints arguments as C strings with --str: a USDT
// probe's, a uprobe's and a uretprobe's return value. The target calls
// named(i, name_of(i)), which fires mp:named(i, name), with the names
// alpha, beta, gamma in turn.
func TestCountStrings(t *testing.T) {
	probetest.RequireBPF(t)
	target := testprogs.USDTTarget(t)
	probes := []string{"usdt:" + target + ":mp:named", "uprobe:" + target + ":named", "uretprobe:" + target + ":name_of"}
	args := append(append([]string{"count", "--args", "--str", "1,ret"}, probes...), "--", target, "3")
	out, errOut, code := execCLI(t, args...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for i, name := range []string{"alpha", "beta", "gamma"} {
		for _, line := range []string{
			fmt.Sprintf("mp:named %d %q\n", i, name),
			fmt.Sprintf("named %d %q ", i, name), // --nargs 3: the third is what x2 or rdx held
			fmt.Sprintf("name_of returned %q\n", name),
		} {
			if !strings.Contains(out, line) {
				t.Errorf("output lacks %q:\n%s", line, out)
			}
		}
	}

	args = append(append([]string{"count", "--json", "--args", "--nargs", "1", "--str", "arg1,ret"}, probes...), "--", target, "1")
	out, errOut, code = execCLI(t, args...)
	var r countReport
	if err := json.Unmarshal([]byte(out), &r); code != 0 || err != nil {
		t.Fatalf("exit %d, %v: %s%s", code, err, out, errOut)
	}
	got := map[string]string{}
	for _, h := range r.Hits {
		got[h.Kind] = fmt.Sprint(h.Strings)
	}
	want := map[string]string{"usdt": "map[arg1:alpha]", "uprobe": "map[arg1:alpha]", "uretprobe": "map[ret:alpha]"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("strings per kind %v, want %v", got, want)
	}

	for _, bad := range [][]string{
		{"--str", "1", probes[0]},                   // without --args
		{"--args", "--str", "x", probes[0]},         // not a number
		{"--args", "--str", "12", probes[0]},        // past the last USDT argument
		{"--args", "--str", "0,1,2,ret", probes[0]}, // more than 3
	} {
		if _, errOut, code := execCLI(t, append([]string{"count"}, bad...)...); code != 2 {
			t.Errorf("count %q: exit %d, want 2: %s", bad, code, errOut)
		}
	}
}

func TestUSDTList(t *testing.T) {
	target := testprogs.USDTTarget(t)
	tests := []struct {
		args     []string
		code     int
		contains string
	}{
		{[]string{"usdt", target}, 0, "mp:inlined  50"},
		{[]string{"usdt", target, "mp:t*"}, 0, "arg1=s32"},
		{[]string{"usdt", target, "nope:*"}, 1, "no matching USDT probes"},
		{[]string{"usdt"}, 2, "need a target"},
		{[]string{"usdt", "/bin/true"}, 1, "no .note.stapsdt"},
	}
	for _, tt := range tests {
		out, errOut, code := runCLI(t, tt.args...)
		if code != tt.code || !strings.Contains(out+errOut, tt.contains) {
			t.Errorf("%q: exit %d, output:\n%s%s\nwant exit %d containing %q", tt.args, code, out, errOut, tt.code, tt.contains)
		}
	}
	out, _, code := runCLI(t, "usdt", "--json", target, "mp:tick")
	var r struct {
		Probes []struct {
			Sites []struct {
				Args []map[string]any
			}
		}
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil || code != 0 || len(r.Probes) != 1 || len(r.Probes[0].Sites[0].Args) != 2 {
		t.Errorf("JSON (%v, exit %d): %s", err, code, out)
	}
}

// findProcess returns the pid of the process whose command line is args,
// and its state letter from /proc/PID/stat, or 0.
func findProcess(args ...string) (int, byte) {
	want := strings.Join(args, "\x00") + "\x00"
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && string(b) == want {
			stat, _ := os.ReadFile("/proc/" + e.Name() + "/stat")
			if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
				return pid, stat[i+2]
			}
			return pid, '?'
		}
	}
	return 0, 0
}

// TestCountEnds checks how `count` ends: a command it started never
// outlives it, a signal detaches and prints what was counted with exit
// status 128+signal, and bad durations are usage errors.
func TestCountEnds(t *testing.T) {
	probetest.RequireBPF(t)
	target := testprogs.PrivateTarget(t, 5)
	probe := "uprobe:" + target + ":func_*"
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		args []string
	}{
		{"negative duration", []string{"count", "--duration", "-1s", probe}},
		{"-- without a command", []string{"count", probe, "--"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, errOut, code := runCLI(t, tc.args...); code != 2 {
				t.Errorf("exit %d, want 2 (usage): %s", code, errOut)
			}
		})
	}

	t.Run("duration ends the command", func(t *testing.T) {
		arg := "301.5" // a command line no other process has
		start := time.Now()
		_, errOut, code := runCLI(t, "count", "--duration", "500ms", probe, "--", sleep, arg)
		if code != 0 || time.Since(start) > 10*time.Second {
			t.Fatalf("exit %d after %v: %s", code, time.Since(start), errOut)
		}
		if pid, _ := findProcess(sleep, arg); pid != 0 {
			t.Errorf("the command (pid %d) outlived count --duration: %s", pid, errOut)
		}
		if !strings.Contains(errOut, "killed by") {
			t.Errorf("stderr does not say the command was ended: %s", errOut)
		}
	})

	// The command's own status, as a shell reports it, is count's.
	for _, tc := range []struct {
		script string
		code   int
		says   string
	}{
		{"exit 0", 0, ""},
		{"exit 3", 3, "exited with status 3"},
		{"kill -KILL $$", 128 + 9, "killed by SIGKILL"},
	} {
		t.Run(tc.script, func(t *testing.T) {
			out, errOut, code := execCLI(t, "count", probe, "--", "/bin/sh", "-c", tc.script)
			if code != tc.code || !strings.Contains(errOut, tc.says) || !strings.Contains(out, "of 5 sites") {
				t.Errorf("exit %d, want %d and %q on stderr, the report on stdout; stdout:\n%s\nstderr:\n%s", code, tc.code, tc.says, out, errOut)
			}
		})
	}

	t.Run("--pid process exits", func(t *testing.T) {
		cmd := exec.Command(sleep, "0.5")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go cmd.Wait()
		start := time.Now()
		_, errOut, code := runCLI(t, "count", "--pid", strconv.Itoa(cmd.Process.Pid), probe)
		if code != 0 || time.Since(start) > 10*time.Second || !strings.Contains(errOut, "exited") {
			t.Errorf("exit %d after %v: %s", code, time.Since(start), errOut)
		}
	})

	t.Run("SIGINT", func(t *testing.T) {
		// While this test holds SIGINT too, the signal cannot end the
		// test binary, whenever it arrives.
		held := make(chan os.Signal, 1)
		signal.Notify(held, os.Interrupt)
		defer signal.Stop(held)
		arg := "302.5"
		type result struct {
			out, errOut string
			code        int
		}
		done := make(chan result, 1)
		go func() {
			out, errOut, code := runCLI(t, "count", probe, "--", sleep, arg)
			done <- result{out, errOut, code}
		}()
		// The command runs (not stopped for tracing) once the probes are
		// attached.
		deadline := time.Now().Add(10 * time.Second)
		for {
			if _, state := findProcess(sleep, arg); state == 'S' || state == 'R' {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the command never ran")
			}
			time.Sleep(20 * time.Millisecond)
		}
		unix.Kill(os.Getpid(), unix.SIGINT)
		r := <-done
		if r.code != 130 || !strings.Contains(r.out, "calls to 0 of 5 sites") {
			t.Errorf("exit %d, want 130 and the report; stdout:\n%s\nstderr:\n%s", r.code, r.out, r.errOut)
		}
		if pid, _ := findProcess(sleep, arg); pid != 0 {
			t.Errorf("the command (pid %d) outlived count's SIGINT", pid)
		}
	})
}

// TestFIFOs gives every command a FIFO where a binary or object belongs:
// each must fail at once, naming it, never block on it.
func TestFIFOs(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"list", fifo, "*"},
		{"usdt", fifo},
		{"count", "--duration", "1s", "uprobe:" + fifo + ":f"},
		{"load", fifo},
	} {
		t.Run(args[0], func(t *testing.T) {
			type result struct {
				errOut string
				code   int
			}
			done := make(chan result, 1)
			go func() {
				_, errOut, code := runCLI(t, args...)
				done <- result{errOut, code}
			}()
			select {
			case r := <-done:
				if r.code != 1 || !strings.Contains(r.errOut, "not a regular file") || !strings.Contains(r.errOut, fifo) {
					t.Errorf("exit %d: %s; want 1 and an error naming the FIFO as not a regular file", r.code, r.errOut)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("blocked on the FIFO")
			}
		})
	}
}

// TestCountBigSpec counts with one spec of 10,000 patterns over 100
// functions: the report must grow with the sites, not with sites × the
// spec's length (each row once repeated the whole spec: 1 GB for this).
func TestCountBigSpec(t *testing.T) {
	probetest.RequireBPF(t)
	const n = 100
	target := testprogs.PrivateTarget(t, n)
	pats := make([]string, 10_000)
	for i := range pats {
		pats[i] = fmt.Sprintf("func_%03d*", i%1000) // each matches some of the 100, or none
	}
	pats[0] = "func_*"
	spec := "uprobe:" + target + ":" + strings.Join(pats, ",")
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	out, errOut, code := runCLI(t, "count", "--json", spec, "--", target, "1")
	runtime.ReadMemStats(&after)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var r countReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	if len(r.Probes) != 1 || len(r.Counts) != n {
		t.Fatalf("%d probes, %d rows; want 1 and %d", len(r.Probes), len(r.Counts), n)
	}
	for _, c := range r.Counts {
		if c.Probe != 0 {
			t.Fatalf("row %s names probe %d, want 0", c.Function, c.Probe)
		}
	}
	if limit := 2*len(spec) + 64<<10; len(out) > limit {
		t.Errorf("report of %d bytes for a %d-byte spec and %d rows, want under %d", len(out), len(spec), n, limit)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<20 {
		t.Errorf("count allocated %d MB, want under 64", alloc>>20)
	}
}

// TestCountWhileReplaced runs count on a program while another goroutine
// keeps replacing it by rename with a build whose functions lie at other
// offsets (an install, a build loop): whichever file each run's command
// runs, its calls are counted exactly, or the run fails; never a silent
// wrong count. The probes go on the file the stopped command runs
// (/proc/PID/exe), not on the one at its path when count resolves it.
func TestCountWhileReplaced(t *testing.T) {
	probetest.RequireBPF(t)
	const calls, runs = 2, 25
	small, big := testprogs.PrivateTarget(t, 5), testprogs.PrivateTarget(t, 20)
	dir := t.TempDir()
	path := filepath.Join(dir, "target")
	variants := [][]byte{}
	for _, p := range []string{small, big} {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		variants = append(variants, data)
	}
	put := func(i int) {
		tmp := fmt.Sprintf("%s.%d", path, i)
		if err := os.WriteFile(tmp, variants[i%2], 0o755); err != nil {
			t.Error(err)
			return
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Error(err)
		}
	}
	put(0)
	stop := make(chan struct{})
	swapped := make(chan int)
	go func() {
		i := 1
		for {
			select {
			case <-stop:
				swapped <- i
				return
			default:
			}
			put(i)
			i++
			time.Sleep(time.Millisecond)
		}
	}()
	wrong := 0
	for run := range runs {
		out, errOut, code := runCLI(t, "count", "--json", "uprobe:"+path+":func_0000[0-4]", "--", path, fmt.Sprint(calls))
		if code != 0 {
			t.Logf("run %d failed, as it may: %s", run, errOut)
			continue
		}
		var r countReport
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("run %d: %v\n%s", run, err, out)
		}
		got := map[string]uint64{}
		for _, c := range r.Counts {
			got[c.Function] = c.Calls
		}
		for i := range 5 {
			if want := uint64(testprogs.ExpectedCalls(i, calls)); got[testprogs.FuncName(i)] != want {
				wrong++
				t.Errorf("run %d: %s counted %d, want %d (exit 0)", run, testprogs.FuncName(i), got[testprogs.FuncName(i)], want)
			}
		}
	}
	close(stop)
	t.Logf("%d runs while the file was replaced %d times, %d wrong counts", runs, <-swapped, wrong)
}

// TestCountWholeLibraries counts every function of real libraries and
// programs on running processes that map them (python3.11 with ssl,
// hashlib, sqlite3, zlib and ctypes loaded, a node, a bash): each
// attaches whole, but for the sites left out with a reason, at most 1%.
// On uprobe_multi only: tens of thousands of per-site perf-event uprobes
// take minutes.
func TestCountWholeLibraries(t *testing.T) {
	probetest.RequireBPF(t)
	f, err := kernelprobe.Detect()
	if err != nil {
		t.Fatal(err)
	}
	if f.Path() != kernelprobe.PathUprobeMulti {
		t.Skip("tens of thousands of sites: uprobe_multi only")
	}
	python, err := elfsym.LookPath("python3.11")
	if err != nil {
		t.Skip(err)
	}
	py := exec.Command(python, "-c", "import ssl, hashlib, sqlite3, zlib, ctypes, sys; print('ready', flush=True); sys.stdin.read()")
	stdin, err := py.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := py.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := py.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); py.Process.Kill(); py.Wait() }()
	if _, err := bufio.NewReader(out).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	pid := strconv.Itoa(py.Process.Pid)
	targets := []string{"libc.so.6", "libm.so.6", "libz.so.1", "libcrypto.so.3", "libssl.so.3", "libsqlite3.so.0", "libffi.so.8", "ld-linux-x86-64.so.2", python}
	if runtime.GOARCH == "arm64" {
		targets = []string{"libc.so.6", "ld-linux-aarch64.so.1"}
	}
	for _, target := range targets {
		t.Run(filepath.Base(target), func(t *testing.T) {
			if _, err := elfsym.LookPath(target); err != nil {
				t.Skip(err)
			}
			checkWhole(t, pid, target)
		})
	}
	for _, prog := range [][]string{{"bash", "-c", "read x"}, {"node", "-e", "process.stdin.on('data', () => {})"}} {
		t.Run(prog[0], func(t *testing.T) {
			path, err := elfsym.LookPath(prog[0])
			if err != nil {
				t.Skip(err)
			}
			cmd := exec.Command(path, prog[1:]...)
			in, err := cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { in.Close(); cmd.Process.Kill(); cmd.Wait() }()
			time.Sleep(200 * time.Millisecond) // mapped by now
			checkWhole(t, strconv.Itoa(cmd.Process.Pid), path)
		})
	}
}

// checkWhole counts every function of target on process pid for a moment
// and checks what attached and what was left out.
func checkWhole(t *testing.T, pid, target string) {
	t.Helper()
	out, errOut, code := runCLI(t, "count", "--json", "-p", pid, "--duration", "0.1", "uprobe:"+target+":*")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var r countReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, s := range r.LeftOut {
		if s.Reason == "" {
			t.Errorf("%s left out without a reason", s.Function)
		}
	}
	if all := r.Sites + len(r.LeftOut); r.Sites*100 < all*99 {
		t.Errorf("%d of %d sites attached, less than 99%%", r.Sites, all)
	}
	t.Logf("%s: %d sites attached, %d left out", target, r.Sites, len(r.LeftOut))
}
