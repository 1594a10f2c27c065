package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/probetest"
)

// checkProfile checks a profile of count's program over calls runs: the
// kernel counted every run, the meter (where the kernel has fentry for
// it) too, and the samples fell on count's own source lines.
func checkProfile(t *testing.T, r *profileReport, calls uint64) {
	t.Helper()
	if r == nil {
		t.Fatal("no profile")
	}
	t.Logf("%d runs, kernel mean %v; cost %+v (%s); %d samples, %d lines: %+v", r.Runs, r.KernelMean, r.Cost, r.CostError, r.Samples, len(r.Lines), r.Lines)
	if r.Program != "count_call" || r.Runs != calls {
		t.Errorf("program %q, %d runs; want count_call, %d", r.Program, r.Runs, calls)
	}
	if c := r.Cost; c != nil {
		// The meter times the first copy alone, where there are any.
		if c.Runs != calls && (r.Copies == 0 || c.Runs == 0 || c.Runs > calls) || c.P50 <= 0 || c.P95 < c.P50 {
			t.Errorf("meter: %d runs (%d copies), p50 %v, p95 %v; want %d runs, 0 < p50 <= p95", c.Runs, r.Copies, c.P50, c.P95, calls)
		}
	} else if r.CostError == "" {
		t.Error("no cost per run, and no reason")
	}
	if r.LinesError != "" || r.Samples == 0 || len(r.Lines) == 0 {
		t.Fatalf("%d samples in %d lines (%s)", r.Samples, len(r.Lines), r.LinesError)
	}
	var sum uint64
	for _, l := range r.Lines {
		sum += l.Samples
		if l.Function != "count_call" || !(strings.HasSuffix(l.File, ".c") || strings.HasSuffix(l.File, ".h")) || l.Line <= 0 {
			t.Errorf("line %+v: want one of count_call's", l)
		}
		// The meter's trampoline is its cost, not count_call's.
		for _, c := range l.Callees {
			if strings.HasPrefix(c.Function, "bpf_trampoline_") {
				t.Errorf("line %s:%d calls %s: trampolines count apart", l.File, l.Line, c.Function)
			}
		}
	}
	if sum != r.Samples {
		t.Errorf("lines have %d samples, the profile %d", sum, r.Samples)
	}
}

// TestCountProfile profiles count's own program while it counts a busy
// target's 100 functions, with pprof and folded outputs.
func TestCountProfile(t *testing.T) {
	probetest.RequireBPF(t)
	const n = 100
	calls := 3000
	if testutil.InGuest() {
		calls = 300 // a uprobe hit costs 100 µs and more when emulated
	}
	target := testprogs.PrivateTarget(t, n)
	dir := t.TempDir()
	pb, folded := filepath.Join(dir, "count.pb.gz"), filepath.Join(dir, "count.folded")
	out, errOut, code := runCLI(t, "count", "--json", "--profile", "--freq", "9999", "-o", pb, "--folded", folded,
		"uprobe:"+target+":func_*", "--", target, fmt.Sprint(calls))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var r countReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	checkProfile(t, r.Profile, r.Calls)
	if r.Calls < uint64(n*calls) {
		t.Errorf("%d calls counted, want at least %d", r.Calls, n*calls)
	}
	b, err := os.ReadFile(pb)
	if err != nil || !bytes.HasPrefix(b, []byte{0x1f, 0x8b}) {
		t.Errorf("pprof file: %v, %d bytes, want gzip", err, len(b))
	}
	b, err = os.ReadFile(folded)
	if err != nil || !strings.HasPrefix(string(b), "count_call;count_call;") {
		t.Errorf("folded stacks: %v, %q", err, b)
	}

	// The text form, and -o without --profile.
	out, errOut, code = runCLI(t, "count", "--profile", "uprobe:"+target+":func_*", "--", target, "300")
	if code != 0 || !strings.Contains(out, "program count_call") || !strings.Contains(out, "samples in the program") {
		t.Errorf("exit %d, output:\n%s%s", code, out, errOut)
	}
	if _, profile, ok := strings.Cut(out, "\nprogram count_call"); ok {
		t.Logf("count's own profile on this kernel:\nprogram count_call%s", profile)
	}
	_, errOut, code = runCLI(t, "count", "-o", pb, "uprobe:"+target+":func_*", "--", target, "1")
	if code != 2 || !strings.Contains(errOut, "give --profile too") {
		t.Errorf("-o without --profile: exit %d, %s", code, errOut)
	}
}

// TestProfileCommand profiles a program that another part of this process
// attached, by ID and by name, while its target runs.
func TestProfileCommand(t *testing.T) {
	probetest.RequireBPF(t)
	testutil.SkipOnMTTCG(t) // its meter patches the program as it runs
	const n = 100
	target := testprogs.PrivateTarget(t, n)
	probes, err := multiprobe.ParseProbes("uprobe:" + target + ":func_*")
	if err != nil {
		t.Fatal(err)
	}
	plan, err := multiprobe.Resolve(probes, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer plan.Close()
	c, err := loadCounter(plan, false, 0, nil, byNone)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	l, err := plan.Attach(c.prog)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// The copies run where the link has them (no BPF cookies).
	info, err := l.Programs()[0].Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	cmd := exec.Command(target, "1000000")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()

	out, errOut, code := runCLI(t, "profile", "--json", "--duration", "2", fmt.Sprint(id))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var r profileReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Logf("%d runs, kernel mean %v; cost %+v (%s); %d samples", r.Runs, r.KernelMean, r.Cost, r.CostError, r.Samples)
	if r.Runs == 0 {
		t.Errorf("no runs in 2 s of a busy target")
	}
	if r.Cost != nil && r.Cost.Runs == 0 {
		t.Errorf("the meter timed no runs")
	}
	if r.Samples == 0 || len(r.Lines) == 0 || r.Lines[0].Function != "count_call" {
		t.Errorf("%d samples, lines %+v (%s)", r.Samples, r.Lines, r.LinesError)
	}

	// Ctrl-C ends a profile early, with its report, and the status a
	// shell gives SIGINT.
	sub := exec.Command(os.Args[0], "profile", "--duration", "60", fmt.Sprint(id))
	sub.Env = append(os.Environ(), cliEnv+"=1")
	var subOut, subErr bytes.Buffer
	sub.Stdout, sub.Stderr = &subOut, &subErr
	if err := sub.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // past its start, even emulated
	sub.Process.Signal(os.Interrupt)
	err = sub.Wait()
	if code := sub.ProcessState.ExitCode(); code != 130 || !strings.Contains(subOut.String(), "samples in the program") {
		t.Errorf("after SIGINT: exit %d (%v), output:\n%s%s", code, err, subOut.String(), subErr.String())
	}

	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		// By name: the program loaded (its copies, where it has any,
		// are named apart).
		{[]string{"profile", "--duration", "0.2", "count_call"}, 0, "program count_call"},
		{[]string{"profile", "no_such_prog_x"}, 1, `no loaded program is named "no_such_prog_x"`},
		{[]string{"profile", "4294967295"}, 1, "program 4294967295"},
		{[]string{"profile"}, 2, "want one program"},
		{[]string{"profile", "--freq", "0", "1"}, 2, "--freq 0"},
	} {
		out, errOut, code := runCLI(t, c.args...)
		if code != c.code || !strings.Contains(out+errOut, c.want) {
			t.Errorf("%s: exit %d, %s%s; want exit %d and %q", c.args, code, out, errOut, c.code, c.want)
		}
	}
}

// TestProfileNoBTF profiles a program loaded without BTF: no cost per run
// and no lines, each with the reason, and exit status 0.
func TestProfileNoBTF(t *testing.T) {
	probetest.RequireBPF(t)
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.SocketFilter,
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
		License:      "MIT",
	})
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	info, err := prog.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	out, errOut, code := runCLI(t, "profile", "--duration", "0.1", fmt.Sprint(id))
	if code != 0 || !strings.Contains(out, "no hot lines: ") || !strings.Contains(out, "no BTF line info") || !strings.Contains(out, "no cost per run: ") {
		t.Errorf("exit %d, output:\n%s%s", code, out, errOut)
	}
}

// TestProfileNameAmbiguous: a name two loaded programs have is an error
// that lists both IDs and the process that holds each.
func TestProfileNameAmbiguous(t *testing.T) {
	probetest.RequireBPF(t)
	name := fmt.Sprintf("mp_amb_%d", os.Getpid()%100000)
	var ids []string
	for range 2 {
		prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
			Name:         name,
			Type:         ebpf.SocketFilter,
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
			License:      "MIT",
		})
		if err != nil {
			t.Fatal(err)
		}
		defer prog.Close()
		info, err := prog.Info()
		if err != nil {
			t.Fatal(err)
		}
		id, _ := info.ID()
		ids = append(ids, fmt.Sprint(id))
	}
	out, errOut, code := runCLI(t, "profile", "--duration", "0.1", name)
	for _, id := range ids {
		if want := fmt.Sprintf("%s held by pid %d (", id, os.Getpid()); !strings.Contains(errOut, want) {
			t.Errorf("stderr does not say %q", want)
		}
	}
	if code != 1 || !strings.Contains(errOut, "2 loaded programs are named") {
		t.Errorf("exit %d, output:\n%s%s", code, out, errOut)
	}
}
