package watch

import (
	"errors"
	"testing"
)

// TestBudgetShares: what each owner may hold of a budget of 80 files and
// 240 fds: root in this root all of it, another user or mount namespace
// an eighth, all of them together three quarters; a file is admitted
// with room for the fds a file holds, and what is given back is
// forgotten.
func TestBudgetShares(t *testing.T) {
	root := owner{uid: 0, ns: 1, host: true}
	nobody := owner{uid: 65534, ns: 1, host: true}
	container := owner{uid: 0, ns: 2}
	for _, tc := range []struct {
		name string
		o    owner
		want int // files admitted, 3 fds each
	}{
		{"root in this root", root, 80},
		{"another user", nobody, 10},
		{"another mount namespace", container, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBudget(80, 240)
			n := 0
			for ; n < 1000; n++ {
				if err := b.admit(tc.o, "f", 1); err != nil {
					if !errors.Is(err, ErrBudget) {
						t.Fatalf("admit: %v, want ErrBudget", err)
					}
					break
				}
				b.queued(tc.o)
				b.attached(tc.o, 3)
			}
			if n != tc.want {
				t.Errorf("%d files admitted, want %d", n, tc.want)
			}
			for range n {
				b.detached(tc.o, 3)
			}
			if b.all != (usage{}) || b.guests != (usage{}) || len(b.byUID) != 0 || len(b.byNS) != 0 {
				t.Errorf("after every file detached: all %+v guests %+v, %d uids, %d namespaces", b.all, b.guests, len(b.byUID), len(b.byNS))
			}
		})
	}

	// Eight users of an eighth each: the guests' three quarters bound
	// them, and root still fits.
	b := newBudget(80, 240)
	guests := 0
	for uid := uint32(1); uid <= 8; uid++ {
		for b.admit(owner{uid: uid, ns: 1, host: true}, "f", 1) == nil {
			b.queued(owner{uid: uid, ns: 1, host: true})
			guests++
		}
	}
	if guests != 60 {
		t.Errorf("eight users hold %d files, want 60 (three quarters of 80)", guests)
	}
	if err := b.admit(root, "f", 1); err != nil {
		t.Errorf("root's file beside them: %v", err)
	}
	// Pending files count their fds to come: 240/8 fds = 10 files of 3.
	b = newBudget(1000, 240)
	pending := 0
	for b.admit(nobody, "f", 1) == nil {
		b.queued(nobody)
		pending++
	}
	if pending != 10 {
		t.Errorf("%d files of nobody's pending at once, want 10 (30 fds, 3 each)", pending)
	}
}
