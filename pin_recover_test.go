package multiprobe_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/probetest"
	"golang.org/x/sys/unix"
)

// The environment of the fault agent (faultAgent): the kill point and
// which of its calls kills ("point#N"), and whether the agent updates its
// pinned Link after pinning it. The pin directory, target and features
// are pinAgent's.
const (
	faultAgentEnv       = "MULTIPROBE_FAULT_AGENT"
	faultAgentUpdateEnv = "MULTIPROBE_FAULT_AGENT_UPDATE"
)

// The probe sets of the fault tests, in a target of 5 functions: the agent
// pins faultSetA and updates to faultSetB; the next agent updates to
// faultSetC. Each has entry and return probes (two units).
var (
	faultSetA = []string{"uprobe:%s:func_*", "uretprobe:%s:func_0000[01]"}
	faultSetB = []string{"uprobe:%s:func_0000[012]", "uretprobe:%s:func_0000[34]"}
	faultSetC = []string{"uprobe:%s:func_0000[34]", "uretprobe:%s:func_00000"}
)

func faultSpecs(set []string, target string) []string {
	out := make([]string, len(set))
	for i, s := range set {
		out[i] = fmt.Sprintf(s, target)
	}
	return out
}

// faultAgent is run by TestMain in a child: it attaches faultSetA
// (updatable), pins its counts at dir_counts and the Link at dir, and with
// faultAgentUpdateEnv updates it to faultSetB; it kills itself with SIGKILL
// at the named call of the kill point, and says "done" if it got through.
func faultAgent(dir, at string) int {
	fail := func(err error) int {
		fmt.Println("ERROR:", err)
		return 1
	}
	point, nth, _ := strings.Cut(at, "#")
	n, err := strconv.Atoi(nth)
	if err != nil {
		return fail(fmt.Errorf("kill point %q: %w", at, err))
	}
	multiprobe.SetFaultAt(func(p string) error {
		if p == point {
			if n--; n == 0 {
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {}
			}
		}
		return nil
	})
	var f kernelprobe.Features
	if err := json.Unmarshal([]byte(os.Getenv(pinAgentFeaturesEnv)), &f); err != nil {
		return fail(err)
	}
	target := os.Getenv(pinAgentTargetEnv)
	spec, err := testprogs.CounterSpec()
	if err != nil {
		return fail(err)
	}
	plan := func(set []string) (*multiprobe.Plan, error) {
		probes, err := multiprobe.ParseProbes(faultSpecs(set, target)...)
		if err != nil {
			return nil, err
		}
		pl, err := multiprobe.Resolve(probes, &multiprobe.Options{Features: &f, Updatable: true})
		if err != nil {
			return nil, err
		}
		return pl, pl.Prepare(spec)
	}
	pa, err := plan(faultSetA)
	if err != nil {
		return fail(err)
	}
	c, err := testprogs.NewCounter(spec)
	if err != nil {
		return fail(err)
	}
	l, err := pa.Attach(c.CountEntry)
	if err != nil {
		return fail(err)
	}
	if err := c.Counts.Pin(dir + "_counts"); err != nil {
		return fail(err)
	}
	if err := l.Pin(dir); err != nil {
		return fail(err)
	}
	if os.Getenv(faultAgentUpdateEnv) != "" {
		pb, err := plan(faultSetB)
		if err != nil {
			return fail(err)
		}
		if err := l.Update(pb); err != nil {
			return fail(err)
		}
	}
	fmt.Println("done")
	return 0
}

// runFaultAgent runs the fault agent to the kill point at and checks that
// it died there.
func runFaultAgent(t *testing.T, f kernelprobe.Features, dir, target, at string, update bool) {
	t.Helper()
	agent := agentCommand(t, f, dir, target, faultAgentEnv+"="+at)
	if update {
		agent.Env = append(agent.Env, faultAgentUpdateEnv+"=1")
	}
	out, err := agent.Output()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the agent was to be killed at %s: %v\n%s", at, err, out)
	}
}

// countDeltas runs the target once and returns what each of the first 64
// counters gained.
func countDeltas(t *testing.T, counts *ebpf.Map, target string) []uint64 {
	t.Helper()
	before, err := testprogs.ReadArray(counts, 64)
	if err != nil {
		t.Fatal(err)
	}
	runTarget(t, target, 1)
	after, err := testprogs.ReadArray(counts, 64)
	if err != nil {
		t.Fatal(err)
	}
	for i := range after {
		after[i] -= before[i]
	}
	return after
}

// checkExact fails t unless deltas are exactly one run of the target
// counted at sites: each site's calls at its cookie, nothing elsewhere.
func checkExact(t *testing.T, what string, deltas []uint64, sites []multiprobe.Site) {
	t.Helper()
	want := make([]uint64, len(deltas))
	for _, s := range sites {
		want[s.Cookie] += uint64(testprogs.ExpectedCalls(funcIndex(t, s.Name), 1))
	}
	for i := range want {
		if deltas[i] != want[i] {
			t.Errorf("%s: counted %v, want %v", what, deltas[:16], want[:16])
			return
		}
	}
}

// TestPinKilled kills an agent at each point of Pin where a crash leaves
// the pin directory half-made, and checks what the next agent finds:
// nothing to take back (ErrNotPinned), the orphaned links silent at once,
// and a Pin in the same directory that works and counts every call once.
// Before, the orphans kept counting, and the next Pin failed with EEXIST
// (or, where it worked, every call counted twice).
func TestPinKilled(t *testing.T) {
	forEachPath(t, func(t *testing.T, f kernelprobe.Features) {
		if f.Path() == kernelprobe.PathPerfEvent && !f.Cookies {
			t.Skip("perf-event uprobes are not links to pin before Linux 5.15")
		}
		target := testprogs.PrivateTarget(t, 5)
		for _, at := range []string{"pin: unit pinned#1", "pin: unit pinned#2"} {
			t.Run(strings.TrimPrefix(at, "pin: "), func(t *testing.T) {
				dir := testutil.BPFFS(t) + "/agent"
				runFaultAgent(t, f, dir, target, at, false)
				counts, err := ebpf.LoadPinnedMap(dir+"_counts", nil)
				if err != nil {
					t.Fatal(err)
				}
				defer counts.Close()
				if _, err := multiprobe.LoadPinnedLink(dir); !errors.Is(err, multiprobe.ErrNotPinned) {
					t.Fatalf("LoadPinnedLink after a Pin cut short: %v, want ErrNotPinned", err)
				}
				checkExact(t, "the orphaned links", countDeltas(t, counts, target), nil)

				c, plans := setup(t, f, multiprobe.Options{Updatable: true}, faultSpecs(faultSetA, target))
				l := mustAttach(t, plans[0], c.CountEntry)
				if err := l.Pin(dir); err != nil {
					t.Fatalf("Pin in the directory of a Pin cut short: %v", err)
				}
				checkExact(t, "the new agent's link", countDeltas(t, c.Counts, target), l.Sites())
				checkExact(t, "the orphaned links, after the new Pin", countDeltas(t, counts, target), nil)
				if err := l.Unpin(); err != nil {
					t.Fatal(err)
				}
			})
		}
	})
}

// TestUpdateKilled kills an agent at each point of an Update of its pinned
// Link where a crash leaves the directory half-made, before the new
// manifest is in place and after, and checks that the next agent takes
// back the set the manifest names, counting every call once (no orphan
// counting, no site missed), updates it again without "file exists", and
// leaves no link and no pin after Unpin and Close. Before, 4 in 50 such
// restarts counted wrong and the next Update failed.
func TestUpdateKilled(t *testing.T) {
	forEachPath(t, func(t *testing.T, f kernelprobe.Features) {
		if f.Path() == kernelprobe.PathPerfEvent && !f.Cookies {
			t.Skip("perf-event uprobes are not links to pin before Linux 5.15")
		}
		target := testprogs.PrivateTarget(t, 5)
		_, plans := setup(t, f, multiprobe.Options{Updatable: true}, faultSpecs(faultSetA, target), faultSpecs(faultSetB, target), faultSpecs(faultSetC, target))
		for _, tc := range []struct {
			at  string
			set int // the set the manifest names afterwards
		}{
			{"update: unit pinned#1", 0},
			{"update: unit pinned#2", 0},
			{"update: commit#1", 0},
			{"update: committed#1", 1},
			{"update: unpinned#1", 1},
		} {
			t.Run(strings.TrimPrefix(tc.at, "update: "), func(t *testing.T) {
				dir := testutil.BPFFS(t) + "/agent"
				runFaultAgent(t, f, dir, target, tc.at, true)
				counts, err := ebpf.LoadPinnedMap(dir+"_counts", nil)
				if err != nil {
					t.Fatal(err)
				}
				defer counts.Close()
				l, err := multiprobe.LoadPinnedLink(dir)
				if err != nil {
					t.Fatalf("LoadPinnedLink after an Update cut short: %v", err)
				}
				defer l.Close()
				if got, want := len(l.Sites()), len(plans[tc.set].Sites()); got != want {
					t.Fatalf("taken back with %d sites, want the %d of set %d", got, want, tc.set)
				}
				checkExact(t, "taken back", countDeltas(t, counts, target), l.Sites())
				if err := l.Update(plans[2]); err != nil {
					t.Fatalf("the next Update: %v", err)
				}
				checkExact(t, "after the next Update", countDeltas(t, counts, target), l.Sites())
				back, err := multiprobe.LoadPinnedLink(dir)
				if err != nil {
					t.Fatalf("taking back after the next Update: %v", err)
				}
				back.Close()
				var progs []*ebpf.Program // held past Close, to find their links by
				for _, p := range l.Programs() {
					p, err := p.Clone()
					if err != nil {
						t.Fatal(err)
					}
					defer p.Close()
					progs = append(progs, p)
				}
				if err := l.Unpin(); err != nil {
					t.Fatal(err)
				}
				if err := l.Close(); err != nil {
					t.Fatal(err)
				}
				if ids := probetest.ProgramLinks(t, progs...); len(ids) > 0 {
					t.Errorf("links %v still attached after Unpin and Close", ids)
				}
				if ents, _ := os.ReadDir(dir); len(ents) > 0 {
					t.Errorf("%s holds %d entries after Unpin", dir, len(ents))
				}
				checkExact(t, "after Close", countDeltas(t, counts, target), nil)
			})
		}
	})
}

// TestUpdateFailsAfterSwitch: an error after the switch of an Update (here
// injected where the old set's pins are removed) is reported, and the new
// set stays the Link's and counts; the next Update finishes the cleanup.
// Before, the rollback closed the new set although it was the Link's, and
// its sites counted only while their pins held them.
func TestUpdateFailsAfterSwitch(t *testing.T) {
	forEachPath(t, func(t *testing.T, f kernelprobe.Features) {
		if f.Path() == kernelprobe.PathPerfEvent && !f.Cookies {
			t.Skip("perf-event uprobes are not links to pin before Linux 5.15")
		}
		target := testprogs.PrivateTarget(t, 5)
		c, plans := setup(t, f, multiprobe.Options{Updatable: true}, faultSpecs(faultSetA, target), faultSpecs(faultSetB, target), faultSpecs(faultSetC, target))
		dir := testutil.BPFFS(t) + "/agent"
		l := mustAttach(t, plans[0], c.CountEntry)
		if err := l.Pin(dir); err != nil {
			t.Fatal(err)
		}
		injected := errors.New("injected")
		multiprobe.SetFaultAt(func(p string) error {
			if p == "update: unpinned" {
				return injected
			}
			return nil
		})
		err := l.Update(plans[1])
		multiprobe.SetFaultAt(nil)
		if !errors.Is(err, injected) || !strings.Contains(err.Error(), "the new sites are attached, but") {
			t.Fatalf("Update with a failure after the switch: %v", err)
		}
		if got, want := len(l.Sites()), len(plans[1].Sites()); got != want {
			t.Fatalf("after the failure the Link has %d sites, want the new set's %d", got, want)
		}
		checkExact(t, "after an Update that failed after its switch", countDeltas(t, c.Counts, target), l.Sites())
		// The new set is the Link's own, not only its pins'.
		if err := l.Unpin(); err != nil {
			t.Fatal(err)
		}
		checkExact(t, "after Unpin", countDeltas(t, c.Counts, target), l.Sites())
		if err := l.Update(plans[2]); err != nil {
			t.Fatalf("the next Update: %v", err)
		}
		checkExact(t, "after the next Update", countDeltas(t, c.Counts, target), l.Sites())
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		checkExact(t, "after Close", countDeltas(t, c.Counts, target), nil)
	})
}

// TestCheckPinDir: a pin directory not on a BPF filesystem is refused, and
// one Pin or CheckPinDir made for it is removed again; on one it is made.
// Before, Pin left the directory it made, and a watch took such a
// directory and then skipped every file.
func TestCheckPinDir(t *testing.T) {
	notBPF := filepath.Join(t.TempDir(), "pins", "agent")
	if err := multiprobe.CheckPinDir(notBPF); !errors.Is(err, unix.EINVAL) {
		t.Errorf("CheckPinDir of a directory on %s: %v, want EINVAL", filepath.Dir(notBPF), err)
	}
	if _, err := os.Stat(notBPF); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after the refusal %s is there (%v)", notBPF, err)
	}
	probetest.RequireBPF(t)
	dir := testutil.BPFFS(t) + "/agent"
	if err := multiprobe.CheckPinDir(dir); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		t.Errorf("CheckPinDir did not make %s: %v", dir, err)
	}
}
