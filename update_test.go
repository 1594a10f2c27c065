package multiprobe_test

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/probetest"
)

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
			rounds = 8 // each site costs ~0.1 s to detach there
		}
		if testutil.InGuest() {
			steadyCalls, rounds = 2_000, min(rounds, 8)
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

		// The steady loop: runs of the target calling functions 0-9.
		var runs atomic.Int64
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var loopErr error
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if out, err := exec.Command(target, fmt.Sprint(steadyCalls), "0", "10").CombinedOutput(); err != nil {
					loopErr = fmt.Errorf("%s: %v: %s", target, err, out)
					return
				}
				runs.Add(1)
			}
		})

		want := make([]uint64, n) // toggled functions' counts
		prev := make([]uint64, 64)
		for r := 0; r <= rounds; r++ {
			if r > 0 {
				if err := l.Update(plans[r]); err != nil {
					close(stop)
					wg.Wait()
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
		close(stop)
		wg.Wait()
		if loopErr != nil {
			t.Fatal(loopErr)
		}
		counts, err := testprogs.ReadArray(c.Counts, 10)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 10 {
			if w := uint64(runs.Load()) * uint64(testprogs.ExpectedCalls(i, steadyCalls)); counts[i] != w {
				t.Errorf("%s (in every set): %d calls counted over %d updates, the target made %d", testprogs.FuncName(i), counts[i], rounds, w)
			}
		}
		t.Logf("%d updates, %d runs of the steady loop (%d calls each) meanwhile", rounds, runs.Load(), 10*steadyCalls)
		if runs.Load() < 2 {
			t.Errorf("the steady loop ran %d times: the updates did not overlap it", runs.Load())
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
