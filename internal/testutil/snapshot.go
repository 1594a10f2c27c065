package testutil

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Snapshot is what a test checks to prove that a Close, or a failed attach,
// left nothing behind: the process's open descriptors and the kernel's links
// for the given programs.
type Snapshot struct {
	FDs   int
	Links []link.ID
	progs []*ebpf.Program
}

// TakeSnapshot records the open fds and the kernel links of progs.
func TakeSnapshot(tb testing.TB, progs ...*ebpf.Program) Snapshot {
	tb.Helper()
	s := Snapshot{progs: progs}
	s.Links = ProgramLinks(tb, progs...)
	fds, err := OpenFDs()
	if err != nil {
		tb.Fatal(err)
	}
	s.FDs = fds
	return s
}

// ProgramLinks lists, by iterating the kernel's links, those attached to
// one of progs.
func ProgramLinks(tb testing.TB, progs ...*ebpf.Program) []link.ID {
	tb.Helper()
	ours := map[ebpf.ProgramID]bool{}
	for _, p := range progs {
		info, err := p.Info()
		if err != nil {
			tb.Fatal(err)
		}
		id, _ := info.ID()
		ours[id] = true
	}
	// The kernel lists a link's ID from its creation but hands out an fd
	// for it only once it is settled (EAGAIN before), so a link another
	// test is making can stop the walk: start again.
	for try := 0; ; try++ {
		ids, err := walkLinks(ours)
		if err == nil {
			return ids
		}
		if !errors.Is(err, unix.EAGAIN) || try == 20 {
			tb.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// walkLinks lists the kernel's links attached to the programs in ours.
func walkLinks(ours map[ebpf.ProgramID]bool) ([]link.ID, error) {
	var ids []link.ID
	var it link.Iterator
	for it.Next() {
		info, err := it.Link.Info()
		if err != nil {
			continue // closed meanwhile, or a type cilium cannot describe
		}
		if ours[info.Program] {
			ids = append(ids, it.ID)
		}
	}
	return ids, it.Err()
}

// Check fails tb if the fds or links differ from the snapshot's.
func (s Snapshot) Check(tb testing.TB, what string) {
	tb.Helper()
	now := TakeSnapshot(tb, s.progs...)
	if now.FDs != s.FDs {
		tb.Errorf("%s: %d fds open, want %d", what, now.FDs, s.FDs)
	}
	s.CheckLinks(tb, what)
}

// linkGrace is how long a closed link may stay visible: the kernel frees
// a perf-event link from a work queue after its last descriptor is closed,
// so its id can outlive the Close by a moment, longer on a loaded machine.
const linkGrace = 2 * time.Second

// CheckLinks is Check for the kernel's links only, for a test whose own
// file descriptors change meanwhile (a child process's pipes). Links the
// snapshot did not have must be gone within linkGrace.
func (s Snapshot) CheckLinks(tb testing.TB, what string) {
	tb.Helper()
	deadline := time.Now().Add(linkGrace)
	for {
		now := ProgramLinks(tb, s.progs...)
		if slices.Equal(now, s.Links) {
			return
		}
		if time.Now().After(deadline) {
			tb.Errorf("%s: kernel links %v, want %v", what, now, s.Links)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
