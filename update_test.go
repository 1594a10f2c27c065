package multiprobe_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/internal/bpfsys"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/probetest"
	"golang.org/x/sys/unix"
)

// steadyLoop runs the target, calling functions 0-9 calls (+ i%3) times
// each, again and again until the function it returns is called, which
// waits for the run in progress and returns how many runs there were.
func steadyLoop(t *testing.T, target string, calls int) (stop func() int64) {
	var runs atomic.Int64
	done := make(chan struct{})
	var wg sync.WaitGroup
	var loopErr error
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			if out, err := exec.Command(target, fmt.Sprint(calls), "0", "10").CombinedOutput(); err != nil {
				loopErr = fmt.Errorf("%s: %v: %s", target, err, out)
				return
			}
			runs.Add(1)
		}
	})
	return func() int64 {
		close(done)
		wg.Wait()
		if loopErr != nil {
			t.Fatal(loopErr)
		}
		return runs.Load()
	}
}

// toggledIn says whether toggled function j (of 10) is in round r's set:
// about half of them, a different half each round.
func toggledIn(r, j int) bool { return (r*7+j*3)%5 < 3 }

// TestUpdateToggles: a target calls ten functions in a steady loop while
// the Link is updated again and again, each update toggling the other ten
// functions of the same binary in and out (so the binary's link is made
// anew every time). The steady functions are counted exactly as the
// target called them: no call missed or counted twice across any switch.
// Between updates the target calls every toggled function once, and each
// is counted in exactly the rounds in which it was in the set.
func TestUpdateToggles(t *testing.T) {
	forEachPath(t, func(t *testing.T, f kernelprobe.Features) {
		// A steady run makes 200,000 calls in a tight loop: a switch must
		// land between the two runs of one call, which a check that reads
		// the generation twice (once per run) gets wrong about once per
		// ten updates here.
		const n = 20
		steadyCalls, rounds := 20_000, 100
		if f.Path() == kernelprobe.PathPerfEvent {
			rounds = 6 // each site costs ~0.1 s to detach there
		}
		if testutil.InGuest() {
			steadyCalls, rounds = 2_000, min(rounds, 5)
		}
		target := testprogs.PrivateTarget(t, n)
		groups := make([][]string, rounds+1)
		for r := range groups {
			var names []string
			for j := range 10 {
				if toggledIn(r, j) {
					names = append(names, testprogs.FuncName(10+j))
				}
			}
			groups[r] = []string{"uprobe:" + target + ":func_0000?"}
			if len(names) > 0 {
				groups[r] = append(groups[r], "uprobe:"+target+":"+strings.Join(names, ","))
			}
		}
		c, plans := setup(t, f, multiprobe.Options{Updatable: true}, groups...)
		before := probetest.TakeSnapshot(t, c.CountEntry)
		l, err := plans[0].Attach(c.CountEntry)
		if err != nil {
			t.Fatal(err)
		}

		stopLoop := steadyLoop(t, target, steadyCalls)

		want := make([]uint64, n) // toggled functions' counts
		prev := make([]uint64, 64)
		for r := 0; r <= rounds; r++ {
			if r > 0 {
				if err := l.Update(plans[r]); err != nil {
					stopLoop()
					t.Fatalf("update %d: %v", r, err)
				}
			}
			runTarget(t, target, 1, "10", "20")
			sites := l.Sites()
			counts, err := testprogs.ReadArray(c.Counts, 64)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range sites {
				i := funcIndex(t, s.Name)
				if i < 10 {
					continue
				}
				want[i] += uint64(testprogs.ExpectedCalls(i, 1))
				if got := counts[s.Cookie] - prev[s.Cookie]; got != uint64(testprogs.ExpectedCalls(i, 1)) {
					t.Errorf("round %d: %s counted %d calls, want %d", r, s.Name, got, testprogs.ExpectedCalls(i, 1))
				}
			}
			// A toggled function's cookie is reused by another in the
			// next round: start from what is there.
			prev = counts
		}
		runs := stopLoop()
		counts, err := testprogs.ReadArray(c.Counts, 10)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 10 {
			if w := uint64(runs) * uint64(testprogs.ExpectedCalls(i, steadyCalls)); counts[i] != w {
				t.Errorf("%s (in every set): %d calls counted over %d updates, the target made %d", testprogs.FuncName(i), counts[i], rounds, w)
			}
		}
		t.Logf("%d updates, %d runs of the steady loop (%d calls each) meanwhile", rounds, runs, 10*steadyCalls)
		if runs == 0 {
			t.Error("the steady loop never ran: the updates did not overlap it")
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		before.Check(t, "after Close")
	})
}

// TestUpdateErrors: Update refuses a Link without the generation check and
// a plan for another path, and leaves the Link as it was.
func TestUpdateErrors(t *testing.T) {
	forEachPath(t, func(t *testing.T, f kernelprobe.Features) {
		target := testprogs.PrivateTarget(t, 5)
		c, plans := setup(t, f, multiprobe.Options{}, []string{"uprobe:" + target + ":func_*"})
		l := mustAttach(t, plans[0], c.CountEntry)
		if err := l.Update(plans[0]); !errors.Is(err, multiprobe.ErrNotUpdatable) {
			t.Errorf("Update of a Link without Options.Updatable: %v, want ErrNotUpdatable", err)
		}
		runTarget(t, target, 2)
		checkPinCounts(t, c, l.Sites(), 2)
	})
}

// TestUpdatePinned: a pinned Link is updated, taken back as after a
// restart, and updated again, while a target calls functions that every
// set has in a steady loop: every call is counted, the pinned layout
// follows each update, and Unpin and Close leave nothing.
func TestUpdatePinned(t *testing.T) {
	forEachPath(t, func(t *testing.T, f kernelprobe.Features) {
		if f.Path() == kernelprobe.PathPerfEvent && !f.Cookies {
			t.Skip("perf-event uprobes are not links to pin before Linux 5.15 (TestPinTakeBack checks the refusal)")
		}
		const n, rounds = 20, 4
		steadyCalls := 20_000
		if testutil.InGuest() {
			steadyCalls = 2_000
		}
		target := testprogs.PrivateTarget(t, n)
		groups := make([][]string, rounds+1)
		for r := range groups {
			groups[r] = []string{"uprobe:" + target + ":func_0000?", "uretprobe:" + target + ":" + testprogs.FuncName(10+r)}
		}
		c, plans := setup(t, f, multiprobe.Options{Updatable: true}, groups...)
		before := probetest.TakeSnapshot(t, c.CountEntry)
		dir := testutil.BPFFS(t) + "/agent"
		l, err := plans[0].Attach(c.CountEntry)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Pin(dir); err != nil {
			t.Fatal(err)
		}

		stopLoop := steadyLoop(t, target, steadyCalls)
		for r := 1; r <= rounds; r++ {
			if r == rounds/2 {
				// A restart: this process's Link goes, another takes
				// it back from its pins.
				if err := l.Close(); err != nil {
					t.Error(err)
				}
				if l, err = multiprobe.LoadPinnedLink(dir); err != nil {
					t.Fatal(err)
				}
			}
			if err := l.Update(plans[r]); err != nil {
				t.Errorf("update %d: %v", r, err)
				break
			}
			back, err := multiprobe.LoadPinnedLink(dir)
			if err != nil {
				out, _ := exec.Command("find", dir).CombinedOutput()
				t.Fatalf("after update %d: %v\n%s", r, err, out)
			}
			if got, want := back.Sites(), plans[r].Sites(); len(got) != len(want) || got[len(got)-1].Name != want[len(want)-1].Name {
				t.Errorf("after update %d the pinned manifest has %d sites ending with %s, want %d ending with %s",
					r, len(got), got[len(got)-1].Name, len(want), want[len(want)-1].Name)
			}
			back.Close()
		}
		runs := stopLoop()
		counts, err := testprogs.ReadArray(c.Counts, 10)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 10 {
			if w := uint64(runs) * uint64(testprogs.ExpectedCalls(i, steadyCalls)); counts[i] != w {
				t.Errorf("%s: %d calls counted across %d updates and a restart, the target made %d", testprogs.FuncName(i), counts[i], rounds, w)
			}
		}
		links := probetest.ProgramLinks(t, l.Programs()...)
		if err := l.Unpin(); err != nil {
			t.Fatal(err)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			ents, _ := os.ReadDir(dir)
			t.Errorf("after Unpin the pin directory is still there: %v", ents)
		}
		checkGone(t, links)
		before.Check(t, "after Unpin and Close")
	})
}

// processRunning reports whether pid is a process that has not exited.
func processRunning(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, state, _ := strings.Cut(string(stat), ") ")
	return !strings.HasPrefix(state, "Z") && !strings.HasPrefix(state, "X")
}

// TestSetPIDsNoWindow: SetPIDs, called again and again with sets that all
// hold the target's pid, never filters the target out for a moment: a
// target calling in a tight loop meanwhile is counted exactly.
func TestSetPIDsNoWindow(t *testing.T) {
	forEachPath(t, func(t *testing.T, f kernelprobe.Features) {
		const n = 20
		calls := 20_000
		if testutil.InGuest() {
			calls = 2_000
		}
		target := testprogs.PrivateTarget(t, n)
		c, plans := setup(t, f, multiprobe.Options{PIDs: []int{os.Getpid()}}, []string{"uprobe:" + target + ":func_0000?"})
		l := mustAttach(t, plans[0], c.CountEntry)
		p := testprogs.Start(t, target, "-wait", fmt.Sprint(calls), "0", "10")
		others := []int{os.Getpid(), 1}
		if err := l.SetPIDs(p.PID(), others[0]); err != nil {
			t.Fatal(err)
		}
		done := make(chan string)
		go func() { done <- p.Finish(t) }()
		sets := 0
		for {
			// The target may exit between the check and SetPIDs, which
			// then refuses its pid.
			if err := l.SetPIDs(p.PID(), others[sets%2]); errors.Is(err, unix.ESRCH) {
				break
			} else if err != nil {
				t.Fatal(err)
			}
			sets++
			if !processRunning(p.PID()) {
				break
			}
		}
		if out, want := <-done, fmt.Sprintf("done %d", testprogs.ExpectedSumRange(0, 10, calls)); out != want {
			t.Errorf("target printed %q, want %q", out, want)
		}
		counts, err := testprogs.ReadArray(c.Counts, 10)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 10 {
			if w := uint64(testprogs.ExpectedCalls(i, calls)); counts[i] != w {
				t.Errorf("%s: %d calls counted across %d SetPIDs, the target made %d", testprogs.FuncName(i), counts[i], sets, w)
			}
		}
		t.Logf("%d SetPIDs while the target ran", sets)
	})
}

// TestUpdateKeepsUnchanged: an update that changes one binary's sites
// keeps the kernel link of the other binary, whose sites and cookies stay.
func TestUpdateKeepsUnchanged(t *testing.T) {
	probetest.RequireBPF(t)
	native, _ := nativeAndPerfEvent(t)
	testutil.RequireKernelFeature(t, native.Path() == kernelprobe.PathUprobeMulti, "uprobe_multi")
	a, b := testprogs.PrivateTarget(t, 5), testprogs.PrivateTarget(t, 5)
	c, plans := setup(t, native, multiprobe.Options{Updatable: true},
		[]string{"uprobe:" + a + ":func_*", "uprobe:" + b + ":func_0000[0-2]"},
		[]string{"uprobe:" + a + ":func_*", "uprobe:" + b + ":func_0000[0-3]"})
	l := mustAttach(t, plans[0], c.CountEntry)
	ids := func() map[string]uint32 {
		out := map[string]uint32{}
		for _, al := range l.Links() {
			infos, err := al.Info()
			if err != nil {
				t.Fatal(err)
			}
			for _, in := range infos {
				out[in.Path] = uint32(in.ID)
			}
		}
		return out
	}
	before := ids()
	if err := l.Update(plans[1]); err != nil {
		t.Fatal(err)
	}
	after := ids()
	if before[a] == 0 || after[a] != before[a] {
		t.Errorf("%s's link was %d, is %d after an update that did not change its sites: want it kept", a, before[a], after[a])
	}
	if after[b] == 0 || after[b] == before[b] {
		t.Errorf("%s's link was %d, is %d after an update that changed its sites: want a new one", b, before[b], after[b])
	}
	runTarget(t, a, 2)
	runTarget(t, b, 2)
	checkPinCounts(t, c, l.Sites(), 2)
}

// holdLinks opens every kernel link that runs one of progs, as a walker
// of the kernel's links (bpftool link list) does, and returns a function
// that closes them: while they are open, closing the Link's own
// descriptors does not detach them.
func holdLinks(t *testing.T, progs []*ebpf.Program) (release func()) {
	t.Helper()
	ids := map[ebpf.ProgramID]bool{}
	for _, p := range progs {
		info, err := p.Info()
		if err != nil {
			t.Fatal(err)
		}
		id, _ := info.ID()
		ids[id] = true
	}
	var held []link.Link
	it := new(link.Iterator)
	defer it.Close()
	for it.Next() {
		info, err := it.Link.Info()
		if err == nil && ids[info.Program] {
			held = append(held, it.Take())
		}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	if len(held) == 0 {
		t.Fatal("no kernel link runs the Link's programs")
	}
	return func() {
		for _, h := range held {
			h.Close()
		}
	}
}

// TestUpdateLingeringLinks: a kernel link that outlives its descriptor
// for a while (another process holds it, as a child between fork and exec
// holds every descriptor) counts nothing once Update has retired its
// generation, nor once an updatable Link is closed. Before, the old set
// kept counting under cookies the new set gives to other sites.
func TestUpdateLingeringLinks(t *testing.T) {
	// The links this test holds are waited for in vain.
	grace := bpfsys.LinkGrace
	bpfsys.LinkGrace = 100 * time.Millisecond
	defer func() { bpfsys.LinkGrace = grace }()
	forEachPath(t, func(t *testing.T, f kernelprobe.Features) {
		if f.Path() == kernelprobe.PathPerfEvent && !f.Cookies {
			t.Skip("perf-event uprobes are not kernel links to hold before Linux 5.15")
		}
		target := testprogs.PrivateTarget(t, 5)
		c, plans := setup(t, f, multiprobe.Options{Updatable: true},
			[]string{"uprobe:" + target + ":func_00000,func_00001"},
			[]string{"uprobe:" + target + ":func_00002"})
		l := mustAttach(t, plans[0], c.CountEntry)
		release := holdLinks(t, l.Programs())
		err := l.Update(plans[1])
		if err != nil {
			release()
			t.Fatal(err)
		}
		runTarget(t, target, 1)
		release()
		counts, err := testprogs.ReadArray(c.Counts, 2)
		if err != nil {
			t.Fatal(err)
		}
		// func_00002 is cookie 0 now, as func_00000 was.
		if want := []uint64{uint64(testprogs.ExpectedCalls(2, 1)), 0}; !slices.Equal(counts, want) {
			t.Errorf("after Update, with the old links still held: counts %v, want %v (func_00002's calls alone)", counts, want)
		}

		release = holdLinks(t, l.Programs())
		defer release()
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		runTarget(t, target, 1)
		after, err := testprogs.ReadArray(c.Counts, 2)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(after, counts) {
			t.Errorf("after Close, with the links still held: counts %v, want %v as before", after, counts)
		}
	})
}

// TestUpdateProgram: a Link running one version of a program is taken
// back from its pins, as by an upgraded agent, and moved to a new version
// of the program with UpdateProgram, one more function in the new set,
// while a target calls the functions of both sets in a steady loop: every
// call is counted once (the two versions count into one pinned map),
// neither missed nor counted by both, and from the switch on only the
// new version runs. Runs tells the versions apart, also after a restart.
func TestUpdateProgram(t *testing.T) {
	forEachPath(t, func(t *testing.T, f kernelprobe.Features) {
		pinned := f.Path() != kernelprobe.PathPerfEvent || f.Cookies
		const n = 20
		steadyCalls := 20_000
		if testutil.InGuest() {
			steadyCalls = 2_000
		}
		target := testprogs.PrivateTarget(t, n)
		dir := testutil.BPFFS(t)
		resolve := func(spec *ebpf.CollectionSpec, specs ...string) *multiprobe.Plan {
			pl, err := multiprobe.Resolve(mustParse(t, specs...), &multiprobe.Options{Features: &f, Updatable: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { pl.Close() })
			if err := pl.Prepare(spec); err != nil {
				t.Fatal(err)
			}
			return pl
		}
		spec1, err := testprogs.CounterSpec()
		if err != nil {
			t.Fatal(err)
		}
		spec2, err := testprogs.CounterSpecV2()
		if err != nil {
			t.Fatal(err)
		}
		plan1 := resolve(spec1, "uprobe:"+target+":func_0000?")
		plan2 := resolve(spec2, "uprobe:"+target+":func_0000?,func_00010")
		c1, err := testprogs.NewCounterSharing(spec1, dir)
		if err != nil {
			t.Fatal(err)
		}
		defer c1.Close()
		c2, err := testprogs.NewCounterSharing(spec2, dir)
		if err != nil {
			t.Fatal(err)
		}
		defer c2.Close()
		before := probetest.TakeSnapshot(t, c1.CountEntry, c2.CountEntry)

		l, err := plan1.Attach(c1.CountEntry)
		if err != nil {
			t.Fatal(err)
		}
		if !l.Runs(c1.CountEntry) || l.Runs(c2.CountEntry) {
			t.Errorf("attached with version 1: Runs(v1) = %v, Runs(v2) = %v; want true, false", l.Runs(c1.CountEntry), l.Runs(c2.CountEntry))
		}
		pin := dir + "/link"
		if pinned {
			// The agent restarts, upgraded: the link is taken back.
			if err := l.Pin(pin); err != nil {
				t.Fatal(err)
			}
			l.Close()
			if l, err = multiprobe.LoadPinnedLink(pin); err != nil {
				t.Fatal(err)
			}
			if !l.Runs(c1.CountEntry) || l.Runs(c2.CountEntry) {
				t.Errorf("taken back: Runs(v1) = %v, Runs(v2) = %v; want true, false", l.Runs(c1.CountEntry), l.Runs(c2.CountEntry))
			}
		}
		stopLoop := steadyLoop(t, target, steadyCalls)
		time.Sleep(50 * time.Millisecond)
		if err := l.UpdateProgram(plan2, c2.CountEntry); err != nil {
			stopLoop()
			t.Fatal(err)
		}
		runs := stopLoop()
		if !l.Runs(c2.CountEntry) || l.Runs(c1.CountEntry) {
			t.Errorf("after UpdateProgram: Runs(v1) = %v, Runs(v2) = %v; want false, true", l.Runs(c1.CountEntry), l.Runs(c2.CountEntry))
		}
		counts, err := testprogs.ReadArray(c1.Counts, n)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 10 {
			if w := uint64(runs) * uint64(testprogs.ExpectedCalls(i, steadyCalls)); counts[i] != w {
				t.Errorf("%s: %d calls counted across the switch of program, the target made %d", testprogs.FuncName(i), counts[i], w)
			}
		}
		// From here only version 2 runs: one more run of the target is
		// counted in full, and by it alone.
		readRuns := func(c *testprogs.Counter) uint64 {
			var v uint64
			if err := c.OutOfRange.Lookup(uint32(0), &v); err != nil {
				t.Fatal(err)
			}
			return v
		}
		v1, v2 := readRuns(c1), readRuns(c2)
		runTarget(t, target, 1, "0", "11")
		var want uint64
		for i := range 11 {
			want += uint64(testprogs.ExpectedCalls(i, 1))
		}
		if got1, got2 := readRuns(c1)-v1, readRuns(c2)-v2; got1 != 0 || got2 != want {
			t.Errorf("a run after the switch: version 1 ran %d times, version 2 %d; want 0 and %d", got1, got2, want)
		}
		after, err := testprogs.ReadArray(c1.Counts, n)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range l.Sites() {
			i := funcIndex(t, s.Name)
			if got := after[s.Cookie] - counts[s.Cookie]; got != uint64(testprogs.ExpectedCalls(i, 1)) {
				t.Errorf("%s: %d calls after the switch, want %d", s.Name, got, testprogs.ExpectedCalls(i, 1))
			}
		}
		t.Logf("%d runs of the steady loop (%d calls each) across the switch", runs, 10*steadyCalls)
		if pinned {
			back, err := multiprobe.LoadPinnedLink(pin)
			if err != nil {
				t.Fatal(err)
			}
			if !back.Runs(c2.CountEntry) || len(back.Sites()) != 11 {
				t.Errorf("taken back after UpdateProgram: Runs(v2) = %v, %d sites; want true, 11", back.Runs(c2.CountEntry), len(back.Sites()))
			}
			back.Close()
			if err := l.Unpin(); err != nil {
				t.Fatal(err)
			}
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		before.Check(t, "after Close")
	})
}
