package watch

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/multiprobe/multiprobe/internal/testprogs"
)

func TestMatchTarget(t *testing.T) {
	for _, tc := range []struct {
		target, path string
		want         bool
	}{
		{"libc", "/usr/lib/x86_64-linux-gnu/libc.so.6", true},
		{"libc", "/usr/lib/x86_64-linux-gnu/libcrypto.so.3", false},
		{"libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6", true},
		{"libssl.so", "/usr/lib/x86_64-linux-gnu/libssl.so.3", true},
		{"libssl.so.3", "/usr/lib/x86_64-linux-gnu/libssl.so.30", false},
		{"bash", "/usr/bin/bash", true},
		{"bash", "/usr/bin/bashbug", false},
		{"/usr/bin/bash", "/usr/bin/bash", true},
		{"/usr/bin/bash", "/bin/bash", false},
		{"/usr/lib/*/libssl.so*", "/usr/lib/x86_64-linux-gnu/libssl.so.3", true},
		{"/usr/lib/*/libssl.so*", "/usr/lib/libssl.so.3", false},
		{"/tmp/x/target", "/tmp/x/target (deleted)", true},
		{"/usr//bin/../bin/bash", "/usr/bin/bash", true},
	} {
		if got := matchTarget(tc.target, tc.path); got != tc.want {
			t.Errorf("matchTarget(%q, %q) = %v, want %v", tc.target, tc.path, got, tc.want)
		}
	}
}

// TestSpellings: a relative path is taken against the working directory,
// and a path through a symbolic link (a directory's, or a path glob's
// directory's) means the file it leads to, as a process's maps name it.
func TestSpellings(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real")
	if err := os.MkdirAll(filepath.Join(real, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(real, "bin", "prog"), []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("real", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	file := filepath.Join(real, "bin", "prog")
	for _, tc := range []struct {
		target, path string
	}{
		{"./link/bin/prog", file},
		{"link/bin/prog", file},
		{"real/bin/prog", file},
		{filepath.Join(dir, "link", "bin", "prog"), file},
		{"./link/bin/p*", file},
		{filepath.Join(dir, "link", "bin", "*"), file},
	} {
		sp := spellings(tc.target)
		if !slices.ContainsFunc(sp, func(s string) bool { return matchTarget(s, tc.path) }) {
			t.Errorf("spellings(%q) = %q: none matches %s", tc.target, sp, tc.path)
		}
	}
	if sp := spellings("libc"); !slices.Equal(sp, []string{"libc"}) {
		t.Errorf("spellings(libc) = %q, want the name alone", sp)
	}
}

// TestTracker: processes that start after the watch, running two copies
// of a program (two files), make each copy appear once with its users,
// and a copy whose last process exits goes idle; a process that ran
// before is found by the scan.
func TestTracker(t *testing.T) {
	requireEvents(t)
	a := testprogs.PrivateTarget(t, 5)
	b := testprogs.PrivateCopy(t, a)
	early := testprogs.Start(t, a, "-wait", "1")

	s, err := newSource()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	events := make(chan event, 1<<12)
	go func() {
		for {
			e, err := s.read()
			if err != nil {
				close(events)
				return
			}
			events <- e
		}
	}()
	appeared := map[string]int{}
	idle := map[string]int{}
	tr := newTracker(func(p string) bool { return p == a || p == b },
		func(f *tracked, _ int) { appeared[f.path]++ },
		func(f *tracked) { idle[f.path]++ })
	tr.scan()
	if appeared[a] != 1 {
		t.Fatalf("the scan found %s %d times, want once (appeared: %v)", a, appeared[a], appeared)
	}
	drain := func() {
		for {
			select {
			case e := <-events:
				tr.handle(e)
			case <-time.After(300 * time.Millisecond):
				return
			}
		}
	}
	var procs []*testprogs.Proc
	for _, path := range []string{a, a, b, b, b} {
		procs = append(procs, testprogs.Start(t, path, "-wait", "1"))
	}
	drain()
	if appeared[a] != 1 || appeared[b] != 1 || len(appeared) != 2 {
		t.Errorf("appeared %v, want each copy once", appeared)
	}
	users := func(p string) int {
		for _, f := range tr.files {
			if f.path == p {
				return len(f.users)
			}
		}
		return -1
	}
	if users(a) != 3 || users(b) != 3 {
		t.Errorf("users: %s %d, %s %d; want 3 and 3", filepath.Base(a), users(a), filepath.Base(b), users(b))
	}
	for _, p := range procs[2:] {
		p.Finish(t)
	}
	drain()
	if idle[b] != 1 || idle[a] != 0 {
		t.Errorf("idle %v after the copy's processes exited, want %s once", idle, b)
	}
	early.Finish(t)
	procs[0].Finish(t)
	procs[1].Finish(t)
	drain()
	if idle[a] != 1 {
		t.Errorf("idle %v after every process exited, want %s once", idle, a)
	}
}

// TestTrackerRescan: after lost events, rescan finds a process the events
// missed and lets go of one that exited unseen: no events are read here at
// all.
func TestTrackerRescan(t *testing.T) {
	a := testprogs.PrivateTarget(t, 5)
	gone := testprogs.Start(t, a, "-wait", "1")
	idle := 0
	tr := newTracker(func(p string) bool { return p == a },
		func(*tracked, int) {},
		func(*tracked) { idle++ })
	tr.scan()
	gone.Finish(t) // its exit is not seen
	missed := testprogs.Start(t, a, "-wait", "1")
	tr.rescan()
	if len(tr.byPID) != 1 || len(tr.byPID[missed.PID()]) != 1 {
		t.Errorf("after the rescan the tracker has processes %v, want %d alone", tr.byPID, missed.PID())
	}
	missed.Finish(t)
	tr.rescan()
	if idle != 1 || len(tr.byPID) != 0 {
		t.Errorf("after the last process exited unseen: idle %d times, processes %v; want once, none", idle, tr.byPID)
	}
}
