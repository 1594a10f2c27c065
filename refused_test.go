package multiprobe_test

import (
	"errors"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/kernelprobe"
)

// TestForeignRefCtr: another tracer holds a uprobe with another
// ref-counter offset at one function of a many-function target. A glob
// over the target attaches every other function, each counted exactly,
// and the Link names that one as left out and why; a probe that names it
// exactly fails, naming it and the kernel's errno. On both paths.
func TestForeignRefCtr(t *testing.T) {
	forEachPath(t, func(t *testing.T, f kernelprobe.Features) {
		n, calls := sitesFor(f, 500, 20), 3
		held := testprogs.FuncName(n / 3)
		target := testprogs.PrivateTarget(t, n)
		c, plans := setup(t, f, multiprobe.Options{}, []string{"uprobe:" + target + ":func_*"}, []string{"uprobe:" + target + ":" + held})
		var off uint64
		for _, s := range plans[0].Sites() {
			if s.Name == held {
				off = s.Offset
			}
		}
		closeForeign, err := testprogs.ForeignUprobe(target, off, 6)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(closeForeign)

		l := mustAttach(t, plans[0], c.CountEntry)
		checkPath(t, l, f)
		left := l.LeftOut()
		if len(left) != 1 || left[0].Name != held || !errors.Is(left[0].LeftOut, unix.EINVAL) || !strings.Contains(left[0].LeftOut.Error(), "ref-counter offset") {
			t.Fatalf("left out %v, want %s with EINVAL naming the other ref-counter offset", left, held)
		}
		t.Logf("left out: %v", left[0].LeftOut)
		runTarget(t, target, calls)
		counts, err := testprogs.ReadArray(c.Counts, n)
		if err != nil {
			t.Fatal(err)
		}
		for cookie, s := range l.Sites() {
			want := uint64(testprogs.ExpectedCalls(funcIndex(t, s.Name), calls))
			if s.Name == held {
				want = 0
			}
			if counts[cookie] != want {
				t.Errorf("%s: %d calls counted, want %d", s.Name, counts[cookie], want)
			}
		}

		_, err = plans[1].Attach(c.CountEntry)
		if !errors.Is(err, unix.EINVAL) || !strings.Contains(err.Error(), held) {
			t.Errorf("attaching %s, named exactly: %v, want EINVAL naming it", held, err)
		}
	})
}
