package multiprobe_test

import (
	"errors"
	"testing"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/kernelprobe"
)

// TestRetarget: a plan retargeted to another copy of its binary, from a
// plan already closed, has the same sites and cookies in the copy, and its
// link counts the copy's calls and not the original's.
func TestRetarget(t *testing.T) {
	forEachPath(t, func(t *testing.T, f kernelprobe.Features) {
		const n, calls = 5, 3
		a := testprogs.PrivateTarget(t, n)
		b := testprogs.PrivateCopy(t, a)
		pl, err := multiprobe.Resolve(mustParse(t, "uprobe:"+a+":func_*"), &multiprobe.Options{Features: &f})
		if err != nil {
			t.Fatal(err)
		}
		pl.Close()
		rp, err := pl.Retarget(b)
		if err != nil {
			t.Fatal(err)
		}
		defer rp.Close()
		want, got := pl.Sites(), rp.Sites()
		if len(got) != len(want) {
			t.Fatalf("%d sites retargeted, %d resolved", len(got), len(want))
		}
		for i := range got {
			w, g := want[i], got[i]
			if g.Path != b || g.Probe.Target != b || g.Name != w.Name || g.Offset != w.Offset || g.Cookie != w.Cookie || g.Probe.Kind != w.Probe.Kind {
				t.Errorf("site %d: %s %s %#x cookie %d (target %s), resolved %s %s %#x cookie %d", i,
					g.Path, g.Name, g.Offset, g.Cookie, g.Probe.Target, w.Path, w.Name, w.Offset, w.Cookie)
			}
		}
		spec, err := testprogs.CounterSpec()
		if err != nil {
			t.Fatal(err)
		}
		if err := rp.Prepare(spec); err != nil {
			t.Fatal(err)
		}
		c, err := testprogs.NewCounter(spec)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		mustAttach(t, rp, c.CountEntry)
		runTarget(t, b, calls)
		runTarget(t, a, calls) // not probed
		counts, err := testprogs.ReadArray(c.Counts, n)
		if err != nil {
			t.Fatal(err)
		}
		for i := range n {
			if w := uint64(testprogs.ExpectedCalls(i, calls)); counts[i] != w {
				t.Errorf("%s: %d calls counted in the copy, want %d", testprogs.FuncName(i), counts[i], w)
			}
		}
	})
}

// TestRetargetErrors: another build, or a plan of two binaries, is refused.
func TestRetargetErrors(t *testing.T) {
	f, err := kernelprobe.Detect()
	if err != nil {
		t.Fatal(err)
	}
	a, other := testprogs.PrivateTarget(t, 5), testprogs.PrivateTarget(t, 20)
	pl, err := multiprobe.Resolve(mustParse(t, "uprobe:"+a+":func_*"), &multiprobe.Options{Features: &f})
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Close()
	if _, err := pl.Retarget(other); !errors.Is(err, multiprobe.ErrFileChanged) {
		t.Errorf("retargeting to another build: %v, want ErrFileChanged", err)
	}
	if _, err := pl.Retarget(t.TempDir() + "/none"); err == nil {
		t.Error("retargeting to a missing file succeeded")
	}
	two, err := multiprobe.Resolve(mustParse(t, "uprobe:"+a+":func_*", "uprobe:"+other+":func_*"), &multiprobe.Options{Features: &f})
	if err != nil {
		t.Fatal(err)
	}
	defer two.Close()
	if _, err := two.Retarget(a); !errors.Is(err, multiprobe.ErrBadSpec) {
		t.Errorf("retargeting a plan of two binaries: %v, want ErrBadSpec", err)
	}
}
