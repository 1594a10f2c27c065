package multiprobe_test

import (
	"errors"
	"testing"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/kernelprobe"
)

// TestCookieBase: two plans of one program, the second with its cookies
// from Options.CookieBase, count their calls each in its own range of the
// program's per-site maps.
func TestCookieBase(t *testing.T) {
	forEachPath(t, func(t *testing.T, f kernelprobe.Features) {
		const n, calls, base = 5, 3, 1000
		a := testprogs.PrivateTarget(t, n)
		b := testprogs.PrivateCopy(t, a)
		spec, err := testprogs.CounterSpec()
		if err != nil {
			t.Fatal(err)
		}
		var plans []*multiprobe.Plan
		for _, pb := range []struct {
			path string
			base uint64
		}{{a, 0}, {b, base}} {
			pl, err := multiprobe.Resolve(mustParse(t, "uprobe:"+pb.path+":func_*"), &multiprobe.Options{Features: &f, CookieBase: pb.base})
			if err != nil {
				t.Fatal(err)
			}
			defer pl.Close()
			if s := pl.Sites(); s[0].Cookie != pb.base || s[n-1].Cookie != pb.base+n-1 {
				t.Fatalf("cookies %d to %d, want from %d", s[0].Cookie, s[n-1].Cookie, pb.base)
			}
			if err := pl.Prepare(spec); err != nil {
				t.Fatal(err)
			}
			plans = append(plans, pl)
		}
		c, err := testprogs.NewCounter(spec)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for _, pl := range plans {
			mustAttach(t, pl, c.CountEntry)
		}
		runTarget(t, a, calls)
		runTarget(t, b, 2*calls)
		counts, err := testprogs.ReadArray(c.Counts, base+n)
		if err != nil {
			t.Fatal(err)
		}
		for i := range n {
			if got, want := counts[i], uint64(testprogs.ExpectedCalls(i, calls)); got != want {
				t.Errorf("%s of %s: %d calls at cookie %d, want %d", testprogs.FuncName(i), a, got, i, want)
			}
			if got, want := counts[base+i], uint64(testprogs.ExpectedCalls(i, 2*calls)); got != want {
				t.Errorf("%s of %s: %d calls at cookie %d, want %d", testprogs.FuncName(i), b, got, base+i, want)
			}
		}
	})
}

// TestCookieBaseRange: cookies past 2^64, or a USDT site's past 2^32, are
// refused.
func TestCookieBaseRange(t *testing.T) {
	f, err := kernelprobe.Detect()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		spec string
		base uint64
	}{
		{"uprobe:" + testprogs.PrivateTarget(t, 5) + ":func_*", 1<<64 - 3},
		{"usdt:" + testprogs.USDTTarget(t) + ":*:*", 1<<32 - 1},
	} {
		_, err := multiprobe.Resolve(mustParse(t, c.spec), &multiprobe.Options{Features: &f, CookieBase: c.base})
		if !errors.Is(err, multiprobe.ErrBadSpec) {
			t.Errorf("%s from cookie %d: %v, want ErrBadSpec", c.spec, c.base, err)
		}
	}
}
