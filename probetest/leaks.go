package probetest

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/multiprobe/multiprobe/internal/fds"
)

// A Snapshot is what a test compares with later to prove that a Close, or
// a failed attach, left nothing behind: the process's open file
// descriptors and the kernel's links of some programs.
type Snapshot struct {
	// FDs is the number of file descriptors the process had open.
	FDs int
	// Links are the ids of the kernel's links attached to the programs.
	Links []link.ID
	progs []*ebpf.Program
}

// TakeSnapshot records the open file descriptors and the kernel links of
// progs. Listing the kernel's links needs CAP_SYS_ADMIN.
func TakeSnapshot(tb testing.TB, progs ...*ebpf.Program) Snapshot {
	tb.Helper()
	s := Snapshot{progs: progs}
	s.Links = ProgramLinks(tb, progs...)
	n, err := fds.Count()
	if err != nil {
		tb.Fatalf("probetest: %v", err)
	}
	s.FDs = n
	return s
}

// OpenFDs returns the number of file descriptors the process has open.
func OpenFDs(tb testing.TB) int {
	tb.Helper()
	n, err := fds.Count()
	if err != nil {
		tb.Fatalf("probetest: %v", err)
	}
	return n
}

// ProgramLinks lists, walking the kernel's links, those attached to one of
// progs.
func ProgramLinks(tb testing.TB, progs ...*ebpf.Program) []link.ID {
	tb.Helper()
	ours := map[ebpf.ProgramID]bool{}
	for _, p := range progs {
		info, err := p.Info()
		if err != nil {
			tb.Fatalf("probetest: %v", err)
		}
		id, _ := info.ID()
		ours[id] = true
	}
	// The kernel lists a link's id from its creation but hands out an fd
	// for it only once it is settled (EAGAIN before), so a link another
	// test is making can stop the walk: start again.
	for try := 0; ; try++ {
		ids, err := walkLinks(ours)
		if err == nil {
			return ids
		}
		if !errors.Is(err, unix.EAGAIN) || try == 20 {
			tb.Fatalf("probetest: listing the kernel's links: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

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

// Check fails tb, naming what, if the open file descriptors or the links
// differ from the snapshot's.
func (s Snapshot) Check(tb testing.TB, what string) {
	tb.Helper()
	if now := OpenFDs(tb); now != s.FDs {
		tb.Errorf("%s: %d file descriptors open, want %d", what, now, s.FDs)
	}
	s.CheckLinks(tb, what)
}

// linkGrace is how long a closed link may stay visible: the kernel frees
// a perf-event link from a work queue after its last descriptor is closed,
// so its id can outlive the Close by a moment, longer on a loaded machine.
const linkGrace = 2 * time.Second

// CheckLinks is Check for the kernel's links only, for a test whose own
// file descriptors change meanwhile (a child process's pipes). Links the
// snapshot did not have must be gone within two seconds.
func (s Snapshot) CheckLinks(tb testing.TB, what string) {
	tb.Helper()
	deadline := time.Now().Add(linkGrace)
	for {
		now := ProgramLinks(tb, s.progs...)
		if slices.Equal(now, s.Links) {
			return
		}
		if time.Now().After(deadline) {
			tb.Errorf("%s: kernel links %v of the programs, want %v", what, now, s.Links)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// CheckLeaks takes a snapshot now and checks it when the test has ended,
// with its deferred calls and the cleanups registered after this call:
// nothing the test opened, attached or loaded for progs may be left.
// Call it after loading the programs and before attaching them. (The
// links of the copies a multiprobe.Link makes of a program, see its
// NumClones, are not the program's: their file descriptors show them.) The
// programs must be open still when the check runs: close them in a
// Cleanup registered before this call (cleanups run last first), not with
// defer.
func CheckLeaks(tb testing.TB, progs ...*ebpf.Program) {
	tb.Helper()
	s := TakeSnapshot(tb, progs...)
	tb.Cleanup(func() {
		// A helper cleanup reports at the test's line that called
		// CheckLeaks, not at this one.
		tb.Helper()
		for _, p := range progs {
			if p.FD() < 0 {
				tb.Errorf("probetest: CheckLeaks: program %v was closed before the check: close it in a Cleanup registered before CheckLeaks", p)
				return
			}
		}
		if tb.Failed() {
			return
		}
		// Fewer is no leak: the test may have closed what was open
		// before (a plan's files, which Prepare needs before loading).
		if now := OpenFDs(tb); now > s.FDs {
			tb.Errorf("when the test ended: %d file descriptors open, %d more than when CheckLeaks was called", now, now-s.FDs)
		}
		s.CheckLinks(tb, "when the test ended")
	})
}
