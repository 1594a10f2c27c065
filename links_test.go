package multiprobe_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/probetest"
	"golang.org/x/sys/unix"
)

// semaCalls is how many calls of fn0, fn1 and fn2 one "c 1" makes to the
// semaphore target (testprogs' c/sema.c).
const semaCalls = 1 + 2 + 3

// TestPIDSetsPerLink attaches one program three times to the same
// functions, with the pid sets [A], [A B] and none, and checks, by the
// calls counted per process, that each link counts exactly the processes
// it was given: a process counted by two links is counted twice. Close and
// SetPIDs change only their own link.
func TestPIDSetsPerLink(t *testing.T) {
	forEachPath(t, func(t *testing.T, f kernelprobe.Features) {
		target := testprogs.PrivateCopy(t, testprogs.SemaTarget(t, false))
		a, b, c := testprogs.Start(t, target), testprogs.Start(t, target), testprogs.Start(t, target)
		specs := mustParse(t, "uprobe:"+target+":fn*")
		spec, err := testprogs.CounterSpec()
		if err != nil {
			t.Fatal(err)
		}
		plan := func(pids ...int) *multiprobe.Plan {
			pl, err := multiprobe.Resolve(specs, &multiprobe.Options{Features: &f, PIDs: pids})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { pl.Close() })
			if err := pl.Prepare(spec); err != nil {
				t.Fatal(err)
			}
			return pl
		}
		onlyA, aAndB, everyone := plan(a.PID()), plan(a.PID(), b.PID()), plan()
		cnt, err := testprogs.NewCounter(spec)
		if err != nil {
			t.Fatal(err)
		}
		defer cnt.Close()

		var total [3]uint64
		round := func(step string, want ...uint64) {
			t.Helper()
			for i, p := range []*testprogs.Proc{a, b, c} {
				p.Do(t, "c 1")
				var got uint64
				cnt.PIDCounts.Lookup(uint32(p.PID()), &got)
				if got-total[i] != want[i]*semaCalls {
					t.Errorf("%s: process %c counted %d calls, want %d", step, "ABC"[i], got-total[i], want[i]*semaCalls)
				}
				total[i] = got
			}
		}

		l1 := mustAttach(t, onlyA, cnt.CountEntry)
		l2 := mustAttach(t, aAndB, cnt.CountEntry)
		round("links [A] and [A B]", 2, 1, 0)
		if err := l2.Close(); err != nil {
			t.Fatal(err)
		}
		round("[A B] closed", 1, 0, 0)
		if err := l1.SetPIDs(); err != nil {
			t.Fatal(err)
		}
		if l1.PIDs() != nil {
			t.Errorf("PIDs() = %v after SetPIDs(), want nil (every process)", l1.PIDs())
		}
		round("[A] set to every process", 1, 1, 1)
		if err := l1.SetPIDs(b.PID()); err != nil {
			t.Fatal(err)
		}
		l3 := mustAttach(t, everyone, cnt.CountEntry)
		// The program as loaded; without BPF cookies, a copy per site.
		if want := map[bool]int{true: 0, false: everyone.Len()}[f.Cookies]; l3.NumClones() != want {
			t.Errorf("a link without pids loaded %d copies of the program, want %d", l3.NumClones(), want)
		}
		round("[B] beside a link without pids", 1, 2, 1)
		if err := l3.SetPIDs(a.PID()); err == nil {
			t.Error("SetPIDs on a link without an in-BPF filter: no error")
		}
	})
}

// TestPIDSetsAcrossPrograms gives two programs of one collection different
// pid sets: an entry program [A] and a return program [A B] on the same
// functions. Each counts only its own processes.
func TestPIDSetsAcrossPrograms(t *testing.T) {
	forEachPath(t, func(t *testing.T, f kernelprobe.Features) {
		target := testprogs.PrivateCopy(t, testprogs.SemaTarget(t, false))
		a, b := testprogs.Start(t, target), testprogs.Start(t, target)
		cnt, plans := setupEach(t, f,
			[]multiprobe.Options{{PIDs: []int{a.PID()}}, {PIDs: []int{a.PID(), b.PID()}}},
			[]string{"uprobe:" + target + ":fn*"}, []string{"uretprobe:" + target + ":fn*"})
		mustAttach(t, plans[0], cnt.CountEntry)
		ret := mustAttach(t, plans[1], cnt.RecordReturn)
		a.Do(t, "c 1")
		b.Do(t, "c 1")
		var gotA, gotB uint64
		cnt.PIDCounts.Lookup(uint32(a.PID()), &gotA)
		cnt.PIDCounts.Lookup(uint32(b.PID()), &gotB)
		if gotA != semaCalls || gotB != 0 {
			t.Errorf("entry program [A]: A %d, B %d calls; want %d, 0", gotA, gotB, semaCalls)
		}
		rets, err := testprogs.ReadArray(cnt.RetCounts, len(ret.Sites()))
		if err != nil {
			t.Fatal(err)
		}
		var sum uint64
		for _, n := range rets {
			sum += n
		}
		if sum != 2*semaCalls {
			t.Errorf("return program [A B]: %d returns, want %d", sum, 2*semaCalls)
		}
	})
}

// TestUSDTSpecsPerLink attaches one USDT program twice to the same probe:
// after one link closes, the other's arguments still read right, because
// each link holds its own references to the spec ids.
func TestUSDTSpecsPerLink(t *testing.T) {
	forEachPath(t, func(t *testing.T, f kernelprobe.Features) {
		const n = 10
		target := testprogs.PrivateCopy(t, testprogs.USDTTarget(t))
		specs := mustParse(t, "usdt:"+target+":mp:tick")
		spec, err := testprogs.USDTCounterSpec()
		if err != nil {
			t.Fatal(err)
		}
		var plans [2]*multiprobe.Plan
		for i := range plans {
			pl, err := multiprobe.Resolve(specs, &multiprobe.Options{Features: &f})
			if err != nil {
				t.Fatal(err)
			}
			defer pl.Close()
			if err := pl.Prepare(spec); err != nil {
				t.Fatal(err)
			}
			plans[i] = pl
		}
		c, err := testprogs.NewUSDTCounter(spec)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		l1 := mustAttach(t, plans[0], c.CountUSDT)
		l2 := mustAttach(t, plans[1], c.CountUSDT)
		read := func() [4]int64 {
			var out [4]int64
			for i, m := range []*ebpf.Map{c.Hits, c.Argc, c.Sum0, c.Sum1} {
				v, err := testprogs.ReadInt64s(m, 1)
				if err != nil {
					t.Fatal(err)
				}
				out[i] = v[0]
			}
			return out
		}
		sumI := int64(n * (n - 1) / 2)
		one := [4]int64{n, 2 * n, sumI, -3 * sumI} // one link, one run
		startUSDT(t, target, n).Finish(t)
		if got := read(); got != [4]int64{2 * one[0], 2 * one[1], 2 * one[2], 2 * one[3]} {
			t.Errorf("two links: hits, argc, sum0, sum1 = %v, want twice %v", got, one)
		}
		before := read()
		if err := l1.Close(); err != nil {
			t.Fatal(err)
		}
		startUSDT(t, target, n).Finish(t)
		after := read()
		if got := [4]int64{after[0] - before[0], after[1] - before[1], after[2] - before[2], after[3] - before[3]}; got != one {
			t.Errorf("after the other link closed: hits, argc, sum0, sum1 = %v, want %v", got, one)
		}
		if err := l2.Close(); err != nil {
			t.Fatal(err)
		}
		if held := heldSpecs(t, c.Specs); held != 0 {
			t.Errorf("%d USDT spec ids still held after both links closed", held)
		}
	})
}

// TestSetPIDsToggles switches a link between every process and a set that
// holds the target, again and again, while the target calls: the target is
// let through before and after each switch, so every call counts. Before,
// a run that read the every-process count before a switch to every process
// and looked the pid up after it had left the set dropped the call (108 of
// 315,000).
func TestSetPIDsToggles(t *testing.T) {
	forEachPath(t, func(t *testing.T, f kernelprobe.Features) {
		const n = 5
		calls := 200_000 // a million calls
		if testutil.InGuest() {
			calls = 4_000
		}
		target := testprogs.PrivateTarget(t, n)
		p := startWaiting(t, target, calls)
		c, plans := setup(t, f, multiprobe.Options{PIDs: []int{p.PID()}}, []string{"uprobe:" + target + ":func_*"})
		l := mustAttach(t, plans[0], c.CountEntry)
		stop := make(chan struct{})
		toggled := make(chan int)
		go func() {
			k := 0
			defer func() { toggled <- k }()
			for ; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				var err error
				if k%2 == 0 {
					err = l.SetPIDs()
				} else {
					err = l.SetPIDs(p.PID())
				}
				if errors.Is(err, unix.ESRCH) {
					return // the target has exited: SetPIDs refuses a pid gone
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
		p.Finish(t)
		close(stop)
		switches := <-toggled
		var want, got uint64
		for i := range n {
			want += uint64(testprogs.ExpectedCalls(i, calls))
		}
		c.PIDCounts.Lookup(uint32(p.PID()), &got)
		if got != want {
			t.Errorf("%d of %d calls counted across %d switches between every process and the target's pid", got, want, switches)
		}
		t.Logf("%d calls across %d switches", want, switches)
	})
}

// TestLinkConcurrent calls a Link's methods from several goroutines at
// once, Update, SetPIDs, Pin and Unpin, Sites, FDs and Programs, then
// Close from two: under -race, nothing races, and the Link ends closed
// with nothing left attached. Before, Update wrote the Link's units and
// copies while the readers and Close took no lock.
func TestLinkConcurrent(t *testing.T) {
	forEachPath(t, func(t *testing.T, f kernelprobe.Features) {
		if f.Path() == kernelprobe.PathPerfEvent && !f.Cookies {
			t.Skip("perf-event uprobes are not links to pin before Linux 5.15")
		}
		target := testprogs.PrivateTarget(t, 5)
		p := startWaiting(t, target, 1)
		defer p.Finish(t)
		c, plans := setup(t, f, multiprobe.Options{Updatable: true, PIDs: []int{p.PID()}},
			[]string{"uprobe:" + target + ":func_0000[01]"}, []string{"uprobe:" + target + ":func_0000[234]"})
		progs := probetest.TakeSnapshot(t, c.CountEntry)
		l, err := plans[0].Attach(c.CountEntry)
		if err != nil {
			t.Fatal(err)
		}
		dir := testutil.BPFFS(t) + "/link"
		rounds := sitesFor(f, 20, 10)
		var wg sync.WaitGroup
		wg.Go(func() {
			for r := range rounds {
				// An update takes ~0.1 s here; one that took the
				// links' grace (bpfsys.LinkGrace) waited for a link
				// still pinned (a Pin after Unpin pinned through
				// second handles that Update did not remove).
				t0 := time.Now()
				err := l.Update(plans[(r+1)%2])
				if d := time.Since(t0); d > 4*time.Second {
					t.Errorf("update %d took %v", r, d)
				}
				if err != nil {
					t.Errorf("update %d: %v", r, err)
				}
			}
		})
		wg.Go(func() {
			for r := range rounds {
				var err error
				if r%2 == 0 {
					err = l.SetPIDs()
				} else {
					err = l.SetPIDs(p.PID())
				}
				if err != nil {
					t.Errorf("SetPIDs %d: %v", r, err)
				}
			}
		})
		wg.Go(func() {
			for r := range rounds {
				if err := l.Pin(dir); err != nil {
					t.Errorf("Pin %d: %v", r, err)
					continue
				}
				if err := l.Unpin(); err != nil {
					t.Errorf("Unpin %d: %v", r, err)
				}
			}
		})
		wg.Go(func() {
			for range 10 * rounds {
				if n := len(l.Sites()); n != 2 && n != 3 {
					t.Errorf("Sites: %d, want 2 or 3", n)
				}
				if len(l.Programs()) == 0 || l.NumFDs() == 0 {
					t.Error("Programs or FDs: none while attached")
				}
				_ = l.LeftOut()
				_ = l.PIDs()
			}
		})
		wg.Wait()
		for range 2 {
			wg.Go(func() {
				if err := l.Close(); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		progs.Check(t, "after Close")
		if err := l.Update(plans[0]); err == nil {
			t.Error("Update of a closed Link: no error")
		}
	})
}

// TestPlanConcurrent: one Plan used from several goroutines at once, as
// its doc allows: Attach and the Links' Close, Sites, LeftOut, Len and
// Retarget; then one Link counts every call exactly, and Close called
// twice at once leaves no program behind.
func TestPlanConcurrent(t *testing.T) {
	forEachPath(t, func(t *testing.T, f kernelprobe.Features) {
		const n, calls = 5, 3
		target := testprogs.PrivateTarget(t, n)
		c, plans := setup(t, f, multiprobe.Options{}, []string{"uprobe:" + target + ":func_*"})
		pl := plans[0]
		progs := probetest.TakeSnapshot(t, c.CountEntry)
		rounds := 5
		if f.Path() == kernelprobe.PathPerfEvent {
			rounds = 2 // each Close waits out a grace period per site
		}
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for range rounds {
					l, err := pl.Attach(c.CountEntry)
					if err != nil {
						t.Errorf("Attach: %v", err)
						return
					}
					if len(l.Sites()) != n {
						t.Errorf("Sites of a Link: %d, want %d", len(l.Sites()), n)
					}
					if err := l.Close(); err != nil {
						t.Errorf("Close: %v", err)
					}
				}
			})
		}
		wg.Go(func() {
			for range 50 {
				if len(pl.Sites()) != n || pl.Len() != n || len(pl.LeftOut()) != 0 {
					t.Errorf("Plan: %d sites, Len %d, %d left out", len(pl.Sites()), pl.Len(), len(pl.LeftOut()))
				}
				if rt, err := pl.Retarget(target); err != nil {
					t.Errorf("Retarget: %v", err)
				} else {
					rt.Close()
				}
			}
		})
		wg.Wait()

		p := startWaiting(t, target, calls)
		l := mustAttach(t, pl, c.CountEntry)
		p.Finish(t)
		counts, err := testprogs.ReadArray(c.Counts, n)
		if err != nil {
			t.Fatal(err)
		}
		for cookie, s := range l.Sites() {
			if want := uint64(testprogs.ExpectedCalls(funcIndex(t, s.Name), calls)); counts[cookie] != want {
				t.Errorf("%s: %d calls counted, want %d", s.Name, counts[cookie], want)
			}
		}
		l.Close()
		progs.Check(t, "after every Link's Close")
		for range 2 {
			wg.Go(func() {
				if err := pl.Close(); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if _, err := pl.Attach(c.CountEntry); err == nil {
			t.Error("Attach of a closed Plan: no error")
		}
	})
}
