package watch

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/probetest"
)

// agentEnv, set, makes this test binary an agent (see TestMain): a Watch
// with a PinDir, as agentConfig says, until it is killed.
const agentEnv = "MULTIPROBE_WATCH_AGENT"

type agentConfig struct {
	Spec     string
	PinDir   string
	MapDir   string // where the counter's counts are pinned, to share
	Features kernelprobe.Features
}

func TestMain(m *testing.M) {
	if cfg := os.Getenv(agentEnv); cfg != "" {
		os.Exit(agent(cfg))
	}
	os.Exit(m.Run())
}

// agent runs a Watch as agentConfig (JSON) says, says "ready" when New has
// returned, and waits to be killed.
func agent(cfg string) int {
	fail := func(err error) int {
		fmt.Println("ERROR:", err)
		return 1
	}
	var c agentConfig
	if err := json.Unmarshal([]byte(cfg), &c); err != nil {
		return fail(err)
	}
	probes, err := multiprobe.ParseProbes(c.Spec)
	if err != nil {
		return fail(err)
	}
	opts := multiprobe.Options{Features: &c.Features}
	spec, err := testprogs.CounterSpec()
	if err != nil {
		return fail(err)
	}
	if err := multiprobe.PrepareSpec(spec, &opts); err != nil {
		return fail(err)
	}
	counter, err := testprogs.NewCounterSharing(spec, c.MapDir)
	if err != nil {
		return fail(err)
	}
	if _, err := New(probes, spec, counter.CountEntry, &Options{Plan: opts, PinDir: c.PinDir}); err != nil {
		return fail(err)
	}
	fmt.Println("ready")
	select {} // until SIGKILL
}

// TestWatchKilledWhileAttaching: an agent with a PinDir, SIGKILLed at
// random times while it attaches and pins ten files (30 rounds, the kill
// anywhere from its start to when an agent is done), and then a Watch on the
// same PinDir: every file is attached or taken back, no pin is in its way,
// every call is counted once (no link a killed agent half-made counts as
// well), and Unpin and Close leave no link and no pin. Before, 13 of 100
// restarts skipped a half-made pin dir and then the file ("pinning ...:
// file exists"), which stayed unprobed.
func TestWatchKilledWhileAttaching(t *testing.T) {
	eachPath(t, testWatchKilledWhileAttaching)
}

func testWatchKilledWhileAttaching(t *testing.T, f kernelprobe.Features) {
	testutil.RequireKernelFeature(t, f.Cookies || f.Path() == kernelprobe.PathUprobeMulti, "pinnable uprobe links (Linux 5.15)")
	const n, calls, files, rounds = 5, 3, 10, 30
	data, err := os.ReadFile(testprogs.BuildTarget(t, n))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var paths []string
	for i := range files {
		p := filepath.Join(dir, fmt.Sprintf("libmpkill.so.%d", i))
		if err := os.WriteFile(p, data, 0o755); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	bpffs := testutil.BPFFS(t)
	cfg := agentConfig{Spec: "uprobe:libmpkill:func_*", PinDir: filepath.Join(bpffs, "watch"), MapDir: bpffs, Features: f}
	cj, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	before := probetest.TakeSnapshot(t)
	// The files run, so that each agent's scan finds them all.
	var procs []*testprogs.Proc
	for _, p := range paths {
		procs = append(procs, testprogs.Start(t, p, "-wait", fmt.Sprint(calls)))
	}

	run := func(kill time.Duration) (ready bool, took time.Duration) {
		cmd := exec.Command(exe)
		cmd.Env = append(os.Environ(), agentEnv+"="+string(cj))
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		start := time.Now()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		said := make(chan string, 1)
		go func() {
			b := make([]byte, 256)
			k, _ := out.Read(b)
			said <- string(b[:k])
		}()
		select {
		case s := <-said:
			took = time.Since(start)
			if s != "ready\n" {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("agent said %q", s)
			}
			ready = true
		case <-time.After(kill):
		}
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		return ready, took
	}
	_, full := run(time.Minute) // how long an agent takes to attach all
	readies := 0
	for range rounds {
		if ready, _ := run(time.Duration(rand.Int64N(int64(full)))); ready {
			readies++
		}
	}
	t.Logf("an agent attaches %d files in %v; killed %d times, %d of them after it was ready", files, full.Round(time.Millisecond), rounds, readies)

	spec, err := testprogs.CounterSpec()
	if err != nil {
		t.Fatal(err)
	}
	opts := multiprobe.Options{Features: &f}
	if err := multiprobe.PrepareSpec(spec, &opts); err != nil {
		t.Fatal(err)
	}
	c, err := testprogs.NewCounterSharing(spec, bpffs)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	probes, err := multiprobe.ParseProbes(cfg.Spec)
	if err != nil {
		t.Fatal(err)
	}
	got := &reports{}
	w, err := New(probes, spec, c.CountEntry, &Options{Plan: opts, PinDir: cfg.PinDir, Report: got.add})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	live := w.Files()
	byPath := map[string]bool{}
	for _, f := range live {
		byPath[f.Path] = true
	}
	for _, p := range paths {
		if !byPath[p] {
			got.mu.Lock()
			t.Errorf("%s neither attached nor taken back; reports: %+v", p, got.all)
			got.mu.Unlock()
		}
	}
	for _, p := range procs {
		p.Finish(t)
	}
	// Counted by function, over every file's cookies: a file attached
	// anew has a range of its own.
	perFunc := map[string]uint64{}
	seen := map[uint64]bool{}
	for _, f := range live {
		for _, s := range f.Link.Sites() {
			if seen[s.Cookie] {
				continue
			}
			seen[s.Cookie] = true
			var k uint64
			if err := c.Counts.Lookup(uint32(s.Cookie), &k); err != nil {
				t.Fatal(err)
			}
			perFunc[s.Name] += k
		}
	}
	for i := range n {
		if want := uint64(files * testprogs.ExpectedCalls(i, calls)); perFunc[testprogs.FuncName(i)] != want {
			t.Errorf("%s: %d calls counted, want %d (%d files)", testprogs.FuncName(i), perFunc[testprogs.FuncName(i)], want, files)
		}
	}
	if err := w.Unpin(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(cfg.PinDir); len(ents) != 0 {
		t.Errorf("%d pins left after Unpin and Close", len(ents))
	}
	c.Counts.Unpin()
	c.Close()
	before.Check(t, "after Unpin and Close")
}
