package multiprobe_test

import (
	"bufio"
	"encoding/json"
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
	"golang.org/x/sys/unix"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/fallback"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/probetest"
)

// TestPinTakeBack pins a Link with entry and return sites and a pid
// filter, closes it, and takes it back: the probes stayed attached, the
// Link taken back has the same sites and pids, its SetPIDs works, a second
// take-back sees the pids set by the first, and Unpin and Close leave
// nothing behind.
func TestPinTakeBack(t *testing.T) {
	forEachPath(t, func(t *testing.T, f kernelprobe.Features) {
		const n, calls = 20, 3
		target := testprogs.PrivateTarget(t, n)
		c, plans := setup(t, f, multiprobe.Options{PIDs: []int{os.Getpid()}},
			[]string{"uprobe:" + target + ":func_*", "uretprobe:" + target + ":func_0000[0-9]"})
		pl := plans[0]
		before := probetest.TakeSnapshot(t, c.CountEntry)
		dir := testutil.BPFFS(t) + "/agent"

		l, err := pl.Attach(c.CountEntry)
		if err != nil {
			t.Fatal(err)
		}
		if f.Path() == kernelprobe.PathPerfEvent && !f.Cookies {
			checkPinRefused(t, l, dir, target, c)
			return
		}
		if err := l.Pin(dir); err != nil {
			t.Fatal(err)
		}
		sites := l.Sites()
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		runTarget(t, target, calls) // filtered out: only this process counts
		checkPinCounts(t, c, sites, 0)

		back, err := multiprobe.LoadPinnedLink(dir)
		if err != nil {
			t.Fatal(err)
		}
		got := back.Sites()
		if len(got) != len(sites) {
			t.Fatalf("taken back with %d sites, want %d", len(got), len(sites))
		}
		for i := range got {
			if got[i].String() != sites[i].String() || got[i].Offset != sites[i].Offset || got[i].Cookie != sites[i].Cookie ||
				got[i].ProbeKind() != sites[i].ProbeKind() {
				t.Errorf("site %d taken back as %v at %#x (cookie %d), want %v at %#x (cookie %d)",
					i, got[i], got[i].Offset, got[i].Cookie, sites[i], sites[i].Offset, sites[i].Cookie)
			}
		}
		if p := back.PIDs(); !slices.Equal(p, []int{os.Getpid()}) {
			t.Errorf("PIDs() taken back = %v, want [%d]", p, os.Getpid())
		}
		if s := back.StaleFiles(); s != nil {
			t.Errorf("StaleFiles() = %v, want none", s)
		}
		if err := back.SetPIDs(); err != nil {
			t.Fatal(err)
		}
		runTarget(t, target, calls)
		checkPinCounts(t, c, sites, calls)
		if err := back.Close(); err != nil {
			t.Fatal(err)
		}

		again, err := multiprobe.LoadPinnedLink(dir)
		if err != nil {
			t.Fatal(err)
		}
		if p := again.PIDs(); p != nil {
			t.Errorf("PIDs() after SetPIDs() in the first take-back = %v, want every process", p)
		}
		links := probetest.ProgramLinks(t, again.Programs()...)
		if len(links) == 0 {
			t.Fatal("the programs taken back have no links")
		}
		if err := again.Unpin(); err != nil {
			t.Fatal(err)
		}
		if err := again.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("after Unpin the pin directory is still there: %v", err)
		}
		checkGone(t, links)
		runTarget(t, target, calls)
		checkPinCounts(t, c, sites, calls)
		before.Check(t, "after Unpin and Close")
		if _, err := multiprobe.LoadPinnedLink(dir); !errors.Is(err, multiprobe.ErrNotPinned) {
			t.Errorf("LoadPinnedLink after Unpin: %v, want ErrNotPinned", err)
		}
	})
}

// checkPinRefused checks that Pin on a kernel without BPF perf links
// (5.10) says why, leaves nothing in dir, and that l still counts.
func checkPinRefused(t *testing.T, l *multiprobe.Link, dir, target string, c *testprogs.Counter) {
	t.Helper()
	err := l.Pin(dir)
	if !errors.Is(err, fallback.ErrPinUnsupported) || !errors.Is(err, ebpf.ErrNotSupported) {
		t.Fatalf("Pin on a kernel without BPF perf links: %v, want fallback.ErrPinUnsupported", err)
	}
	t.Log(err)
	if ents, err := os.ReadDir(dir); err == nil && len(ents) > 0 {
		t.Errorf("a refused Pin left %d entries in %s", len(ents), dir)
	}
	if err := l.SetPIDs(); err != nil {
		t.Fatal(err)
	}
	runTarget(t, target, 3)
	checkPinCounts(t, c, l.Sites(), 3)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

// checkPinCounts checks that each site counted the calls of rounds runs of
// a generated target with calls calls.
func checkPinCounts(t *testing.T, c *testprogs.Counter, sites []multiprobe.Site, calls int) {
	t.Helper()
	counts, err := testprogs.ReadArray(c.Counts, len(sites))
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range sites {
		want := uint64(0)
		if calls > 0 {
			want = uint64(testprogs.ExpectedCalls(funcIndex(t, s.Name), calls))
		}
		if counts[i] != want {
			t.Errorf("%s: %d calls counted, want %d", s, counts[i], want)
		}
	}
}

// checkGone fails t if one of the links still exists after a grace period.
func checkGone(t *testing.T, ids []link.ID) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for _, id := range ids {
		for {
			l, err := link.NewFromID(id)
			if err != nil {
				break
			}
			l.Close()
			if time.Now().After(deadline) {
				t.Errorf("link %d still exists after Unpin and Close", id)
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// The environment of TestPinAgentKilled's agent: the pin directory, the
// target and the features to attach with, as JSON.
const (
	pinAgentEnv         = "MULTIPROBE_PIN_AGENT"
	pinAgentTargetEnv   = "MULTIPROBE_PIN_AGENT_TARGET"
	pinAgentFeaturesEnv = "MULTIPROBE_PIN_AGENT_FEATURES"
)

// pinAgentSpecs are what the agent probes in a target of 20 functions.
func pinAgentSpecs(target string) []string {
	return []string{"uprobe:" + target + ":func_*", "uretprobe:" + target + ":func_0000[0-4]"}
}

// pinAgent is the agent of TestPinAgentKilled, run by TestMain in a child
// process: it attaches the counter to the target, pins its counts map at
// dir_counts and the Link at dir, says "pinned" and waits to be killed.
func pinAgent(dir string) int {
	fail := func(err error) int {
		fmt.Println("ERROR:", err)
		return 1
	}
	var f kernelprobe.Features
	if err := json.Unmarshal([]byte(os.Getenv(pinAgentFeaturesEnv)), &f); err != nil {
		return fail(err)
	}
	probes, err := multiprobe.ParseProbes(pinAgentSpecs(os.Getenv(pinAgentTargetEnv))...)
	if err != nil {
		return fail(err)
	}
	pl, err := multiprobe.Resolve(probes, &multiprobe.Options{Features: &f})
	if err != nil {
		return fail(err)
	}
	spec, err := testprogs.CounterSpec()
	if err != nil {
		return fail(err)
	}
	if err := pl.Prepare(spec); err != nil {
		return fail(err)
	}
	c, err := testprogs.NewCounter(spec)
	if err != nil {
		return fail(fmt.Errorf("loading the counter: %w", err))
	}
	l, err := pl.Attach(c.CountEntry)
	if err != nil {
		return fail(err)
	}
	if err := c.Counts.Pin(dir + "_counts"); err != nil {
		return fail(fmt.Errorf("pinning the counts: %w", err))
	}
	if err := l.Pin(dir); err != nil {
		return fail(err)
	}
	fmt.Println("pinned")
	select {} // until SIGKILL
}

// TestPinAgentKilled: an agent process attaches, pins, and is killed with
// SIGKILL while a target runs; this process takes the Link back, and
// every call the target made is counted exactly: nothing was lost across
// the restart.
func TestPinAgentKilled(t *testing.T) {
	forEachPath(t, func(t *testing.T, f kernelprobe.Features) {
		if f.Path() == kernelprobe.PathPerfEvent && !f.Cookies {
			t.Skip("perf-event uprobes are not links to pin before Linux 5.15 (TestPinTakeBack checks the refusal)")
		}
		const n = 20
		// Long enough (about 2 s here) that the target still runs when
		// the Link is taken back.
		calls := 5_000
		if testutil.InGuest() {
			calls = 1_000
		}
		target := testprogs.PrivateTarget(t, n)
		dir := testutil.BPFFS(t) + "/agent"
		agent := agentCommand(t, f, dir, target)
		out, err := agent.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := agent.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { agent.Process.Kill(); agent.Wait() })
		line, _ := bufio.NewReader(out).ReadString('\n')
		if line != "pinned\n" {
			t.Fatalf("agent said %q, want pinned", line)
		}

		run := exec.Command(target, strconv.Itoa(calls))
		var stdout strings.Builder
		run.Stdout = &stdout
		if err := run.Start(); err != nil {
			t.Fatal(err)
		}
		if err := agent.Process.Signal(unix.SIGKILL); err != nil {
			t.Fatal(err)
		}
		agent.Wait()
		l, err := multiprobe.LoadPinnedLink(dir)
		if err != nil {
			t.Fatal(err)
		}
		if !processRunning(run.Process.Pid) {
			t.Error("the target had finished when the Link was taken back: make it run longer")
		}
		if err := run.Wait(); err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("done %d\n", testprogs.ExpectedSum(n, calls)); stdout.String() != want {
			t.Fatalf("target printed %q, want %q", stdout.String(), want)
		}

		counts, err := ebpf.LoadPinnedMap(dir+"_counts", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer counts.Close()
		sites := l.Sites()
		if len(sites) != n+5 {
			t.Errorf("taken back with %d sites, want %d", len(sites), n+5)
		}
		got, err := testprogs.ReadArray(counts, len(sites))
		if err != nil {
			t.Fatal(err)
		}
		for i, s := range sites {
			if want := uint64(testprogs.ExpectedCalls(funcIndex(t, s.Name), calls)); got[i] != want {
				t.Errorf("%s: %d calls counted, the target made %d", s, got[i], want)
			}
		}
		links := probetest.ProgramLinks(t, l.Programs()...)
		if err := l.Unpin(); err != nil {
			t.Fatal(err)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if err := counts.Unpin(); err != nil {
			t.Fatal(err)
		}
		checkGone(t, links)
	})
}

// TestPinStale: a binary replaced by a rename after its Link was pinned
// (a package upgrade) is reported by the Link taken back: its pinned links
// probe the old file, and calls in the new one are not counted.
func TestPinStale(t *testing.T) {
	forEachPath(t, func(t *testing.T, f kernelprobe.Features) {
		if f.Path() == kernelprobe.PathPerfEvent && !f.Cookies {
			t.Skip("perf-event uprobes are not links to pin before Linux 5.15 (TestPinTakeBack checks the refusal)")
		}
		const n = 5
		target := testprogs.PrivateTarget(t, n)
		c, plans := setup(t, f, multiprobe.Options{}, []string{"uprobe:" + target + ":func_*"})
		dir := testutil.BPFFS(t) + "/agent"
		l := mustAttach(t, plans[0], c.CountEntry)
		if err := l.Pin(dir); err != nil {
			t.Fatal(err)
		}
		l.Close()
		plans[0].Close()

		data, err := os.ReadFile(target)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(target+".new", data, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(target+".new", target); err != nil {
			t.Fatal(err)
		}
		back, err := multiprobe.LoadPinnedLink(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			back.Unpin()
			back.Close()
		}()
		stale := back.StaleFiles()
		if len(stale) != 1 || !errors.Is(stale[0], multiprobe.ErrFileChanged) || !strings.Contains(stale[0].Error(), target) {
			t.Fatalf("StaleFiles() = %v, want one error naming %s and wrapping ErrFileChanged", stale, target)
		}
		t.Log(stale[0])
		runTarget(t, target, 2)
		checkPinCounts(t, c, back.Sites(), 0)
	})
}

// TestPinUSDT: a Link with USDT sites (arguments, a semaphore) is pinned,
// closed and taken back: the semaphore stays set, the arguments are read
// through the spec ids the pinned spec map holds, and Unpin and Close give
// the ids back.
func TestPinUSDT(t *testing.T) {
	forEachPath(t, func(t *testing.T, f kernelprobe.Features) {
		if f.Path() == kernelprobe.PathPerfEvent && !f.Cookies {
			t.Skip("perf-event uprobes are not links to pin before Linux 5.15 (TestPinTakeBack checks the refusal)")
		}
		const n = 20
		target := testprogs.PrivateCopy(t, testprogs.USDTTarget(t))
		p := startUSDT(t, target, n)
		pl, err := multiprobe.Resolve(mustParse(t, "usdt:"+target+":mp:tick", "usdt:"+target+":mp:guarded", "uprobe:"+target+":report"), &multiprobe.Options{Features: &f})
		if err != nil {
			t.Fatal(err)
		}
		defer pl.Close()
		spec, err := testprogs.USDTCounterSpec()
		if err != nil {
			t.Fatal(err)
		}
		if err := pl.Prepare(spec); err != nil {
			t.Fatal(err)
		}
		c, err := testprogs.NewUSDTCounter(spec)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		dir := testutil.BPFFS(t) + "/agent"
		l, err := pl.Attach(c.CountUSDT)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Pin(dir); err != nil {
			t.Fatal(err)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		back, err := multiprobe.LoadPinnedLink(dir)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := p.Finish(t), fmt.Sprintf("done %d", n); got != want {
			t.Errorf("target said %q, want %q: the guarded probe's semaphore was not set", got, want)
		}
		sites := back.Sites()
		hits, _ := testprogs.ReadInt64s(c.Hits, len(sites))
		sum0, _ := testprogs.ReadInt64s(c.Sum0, len(sites))
		sum1, err := testprogs.ReadInt64s(c.Sum1, len(sites))
		if err != nil {
			t.Fatal(err)
		}
		sumI := int64(n * (n - 1) / 2)
		for i, s := range sites {
			var want [3]int64
			switch s.Name {
			case "mp:tick":
				want = [3]int64{n, sumI, -3 * sumI}
				if s.USDT == nil || len(s.USDT.Args) != 2 {
					t.Errorf("%s taken back without its arguments: %+v", s.Name, s.USDT)
				}
			case "mp:guarded":
				want = [3]int64{n, sumI, 0}
			case "report":
				want = [3]int64{1, 0, 0}
			}
			if got := [3]int64{hits[i], sum0[i], sum1[i]}; got != want {
				t.Errorf("%s: hits, sum0, sum1 = %v, want %v", s.Name, got, want)
			}
		}
		if held := heldSpecs(t, c.Specs); held == 0 {
			t.Error("no USDT spec id held by the pinned link")
		}
		if err := back.Unpin(); err != nil {
			t.Fatal(err)
		}
		if err := back.Close(); err != nil {
			t.Fatal(err)
		}
		if held := heldSpecs(t, c.Specs); held != 0 {
			t.Errorf("%d USDT spec ids still held after Unpin and Close", held)
		}
	})
}

// agentCommand is this test binary as an agent (see TestMain) pinning in
// dir, probing target with features f; env is more of its environment.
func agentCommand(t *testing.T, f kernelprobe.Features, dir, target string, env ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	fj, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	agent := exec.Command(exe)
	agent.Env = append(os.Environ(), pinAgentEnv+"="+dir, pinAgentTargetEnv+"="+target, pinAgentFeaturesEnv+"="+string(fj))
	agent.Env = append(agent.Env, env...)
	return agent
}
