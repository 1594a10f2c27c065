package multiprobe_test

import (
	"fmt"
	"os/exec"
	"testing"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/attach"
	"github.com/multiprobe/multiprobe/elfsym"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/kernelprobe"
)

// TestGoStackGrowth counts the calls of a Go program's functions while
// 50 goroutines recurse 2,000 deep, so that their stacks grow again and
// again: runtime.morestack then runs the function from its first
// instruction a second time. Entry sites past the stack check count every
// call once; the same run, probed at the symbols' addresses, counts more,
// which shows the test can tell. Both attach paths, with and without a
// symbol table, on x86-64 and arm64.
func TestGoStackGrowth(t *testing.T) {
	testutil.SkipOnMTTCG(t)
	const goroutines, depth, n = 50, 2000, 100
	want := map[string]uint64{"main.Deep": goroutines * (depth + 1), "main.Big": n, "main.Leaf": n, "main.Panicky": n}
	forEachPath(t, func(t *testing.T, f kernelprobe.Features) {
		for _, stripped := range []bool{false, true} {
			t.Run(fmt.Sprintf("stripped=%v", stripped), func(t *testing.T) {
				target := testprogs.PrivateCopy(t, testprogs.GoTarget(t, stripped))
				c, plans := setup(t, f, multiprobe.Options{}, []string{"uprobe:" + target + ":main.Deep,main.Big,main.Leaf,main.Panicky"})
				l := mustAttach(t, plans[0], c.CountEntry)
				run := func() {
					t.Helper()
					out, err := exec.Command(target, fmt.Sprint(goroutines), fmt.Sprint(depth), fmt.Sprint(n)).CombinedOutput()
					if err != nil {
						t.Fatalf("%s: %v\n%s", target, err, out)
					}
				}
				run()
				sites := l.Sites()
				counts, err := testprogs.ReadArray(c.Counts, len(sites))
				if err != nil {
					t.Fatal(err)
				}
				for cookie, s := range sites {
					if counts[cookie] != want[s.Name] {
						t.Errorf("%s (offset %#x, symbol at %#x, %q): %d calls, want %d",
							s.Name, s.Offset, s.Symbol.SymbolOffset, s.Symbol.Moved, counts[cookie], want[s.Name])
					}
					if moved := s.Symbol.Moved == elfsym.MovedGoStackCheck; moved != (s.Name != "main.Leaf") {
						t.Errorf("%s: moved %q", s.Name, s.Symbol.Moved)
					}
				}
				if err := l.Close(); err != nil {
					t.Fatal(err)
				}

				// The same run probed at the symbol of Deep, as a
				// tool that takes the symbol table at its word does.
				var deep multiprobe.Site
				for _, s := range sites {
					if s.Name == "main.Deep" {
						deep = s
					}
				}
				if f.Path() != kernelprobe.PathUprobeMulti {
					return // the same on the other path; one is enough
				}
				raw, err := attach.UprobeMulti(c.CountEntry, []attach.Target{{Path: target, Offsets: []uint64{deep.Symbol.SymbolOffset}, Cookies: []uint64{deep.Cookie}}}, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer raw.Close()
				before := counts[deep.Cookie]
				run()
				counts, err = testprogs.ReadArray(c.Counts, len(sites))
				if err != nil {
					t.Fatal(err)
				}
				if got := counts[deep.Cookie] - before; got <= want["main.Deep"] {
					t.Errorf("at the symbol's address, Deep counted %d calls: no more than the %d calls made, so this test cannot tell", got, want["main.Deep"])
				} else {
					t.Logf("at the symbol's address, Deep counted %d calls for %d made", got, want["main.Deep"])
				}
			})
		}
	})
}

// TestGoReturns attaches uretprobe specs to a Go program: entry probes on
// each function's return instructions stand for the kernel's return probe,
// which would crash it. Every return is counted once, stack growth or not,
// the last return value is read from the result register, and the program
// exits normally. Both attach paths, with and without a symbol table.
func TestGoReturns(t *testing.T) {
	testutil.SkipOnMTTCG(t)
	const goroutines, depth, n = 50, 2000, 100
	want := map[string]struct {
		calls uint64
		last  int64
	}{
		"main.Deep": {goroutines * (depth + 1), depth / 2}, // Deep(n) counts the odd numbers up to n
		"main.Big":  {n, n - 1},
		"main.Leaf": {n, 2*(n-1) + 1},
		"main.Pair": {n, 1 - n}, // n-1 is odd: (-(n-1), 2)
		// A panic unwinds without returning: every tenth call of
		// Panicky is no return; the last return is Panicky(99).
		"main.Panicky": {n - n/10, 99},
	}
	forEachPath(t, func(t *testing.T, f kernelprobe.Features) {
		for _, stripped := range []bool{false, true} {
			t.Run(fmt.Sprintf("stripped=%v", stripped), func(t *testing.T) {
				target := testprogs.PrivateCopy(t, testprogs.GoTarget(t, stripped))
				c, plans := setup(t, f, multiprobe.Options{}, []string{"uretprobe:" + target + ":main.Deep,main.Big,main.Leaf,main.Pair,main.Panicky"})
				l := mustAttach(t, plans[0], c.RecordReturn)
				out, err := exec.Command(target, fmt.Sprint(goroutines), fmt.Sprint(depth), fmt.Sprint(n)).CombinedOutput()
				if err != nil {
					t.Fatalf("%s: %v\n%s", target, err, out)
				}
				sites := l.Sites()
				counts, err := testprogs.ReadArray(c.RetCounts, len(sites))
				if err != nil {
					t.Fatal(err)
				}
				values, err := testprogs.ReadArray(c.RetValues, len(sites))
				if err != nil {
					t.Fatal(err)
				}
				for cookie, s := range sites {
					w := want[s.Name]
					if len(s.Returns) == 0 {
						t.Errorf("%s: no return instructions", s.Name)
					}
					if counts[cookie] != w.calls || int64(values[cookie]) != w.last {
						t.Errorf("%s (returns at %#x): %d returns, last value %d; want %d, %d",
							s.Name, s.Returns, counts[cookie], int64(values[cookie]), w.calls, w.last)
					}
				}
			})
		}
	})
}
