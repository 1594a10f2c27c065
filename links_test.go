package multiprobe_test

import (
	"testing"

	"github.com/cilium/ebpf"
	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/kernelprobe"
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
		if want := map[bool]int{true: 0, false: everyone.Len()}[f.Cookies]; l3.Clones() != want {
			t.Errorf("a link without pids loaded %d copies of the program, want %d", l3.Clones(), want)
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
