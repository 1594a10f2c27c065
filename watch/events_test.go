package watch

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/multiprobe/multiprobe/elfsym"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/probetest"
)

// collect reads events from s until stop is closed.
func collect(t *testing.T, s *source) (events func() []event) {
	t.Helper()
	ch := make(chan event, 1<<16)
	go func() {
		for {
			e, err := s.read()
			if err != nil {
				close(ch)
				return
			}
			ch <- e
		}
	}()
	var got []event
	// Quiet this long means the events are all in; an emulated guest
	// delivers them slowly.
	idle := 200 * time.Millisecond
	if testutil.InGuest() {
		idle = 2 * time.Second
	}
	return func() []event {
		for {
			select {
			case e, ok := <-ch:
				if !ok {
					return got
				}
				got = append(got, e)
			case <-time.After(idle):
				return got
			}
		}
	}
}

// mmapAt reports whether events hold a mapping of pid at one of maps'
// starts whose path contains name.
func mmapAt(events []event, pid int, maps []elfsym.Mapping, name string) bool {
	for _, e := range events {
		if e.PID != uint32(pid) || e.Kind != eventMmap {
			continue
		}
		for _, m := range maps {
			if m.Start == e.Addr && strings.Contains(m.Path, name) {
				return true
			}
		}
	}
	return false
}

func has(events []event, pid int, kind eventKind) bool {
	for _, e := range events {
		if e.PID == uint32(pid) && e.Kind == kind {
			return true
		}
	}
	return false
}

// TestEvents: a program started after the source is attached shows as an
// exec, the executable mappings of its libraries as mmap events at the
// starts /proc/PID/maps gives, and its end as an exit.
func TestEvents(t *testing.T) {
	requireEvents(t)
	s, err := newSource()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	events := collect(t, s)

	target := testprogs.PrivateTarget(t, 5)
	p := testprogs.Start(t, target, "-wait", "1")
	maps, err := elfsym.ExecutableMappings(p.PID())
	if err != nil {
		t.Fatal(err)
	}
	got := events()
	if !has(got, p.PID(), eventExec) {
		t.Errorf("no exec event for %d among %d events", p.PID(), len(got))
	}
	// exec maps the program and its interpreter itself: the exec event
	// stands for them. ld.so maps the libraries.
	if !mmapAt(got, p.PID(), maps, "libc.so") {
		t.Errorf("no mmap event of %d at its mapping of libc (maps: %+v)", p.PID(), maps)
	}
	p.Finish(t)
	if got := events(); !has(got, p.PID(), eventExit) {
		t.Errorf("no exit event for %d", p.PID())
	}
	if n := s.lost(); n != 0 {
		t.Errorf("%d events lost", n)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.read(); !errors.Is(err, os.ErrClosed) {
		t.Errorf("read after Close: %v, want os.ErrClosed", err)
	}
}

// TestEventsDlopen: a library a running program opens with dlopen shows
// as an mmap event at its mapping.
func TestEventsDlopen(t *testing.T) {
	requireEvents(t)
	py, err := exec.LookPath("python3")
	testutil.RequireTool(t, "python3", err)
	s, err := newSource()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	events := collect(t, s)
	p := testprogs.Start(t, py, "-c", `import sys, ctypes
print("ready", flush=True)
sys.stdin.readline()
ctypes.CDLL("libz.so.1")
print("opened", flush=True)
sys.stdin.readline()`)
	events()
	if line := p.Do(t, "go"); line != "opened" {
		t.Fatalf("python said %q", line)
	}
	maps, err := elfsym.ExecutableMappings(p.PID())
	if err != nil {
		t.Fatal(err)
	}
	if got := events(); !mmapAt(got, p.PID(), maps, "libz.so") {
		t.Errorf("no mmap event of %d at its mapping of libz after dlopen", p.PID())
	}
}

// TestFileVMAs: the task_vma iterator lists this process's executable
// mappings, each with the file the kernel maps, which for files on no
// overlay is what stat(2) says.
func TestFileVMAs(t *testing.T) {
	requireEvents(t)
	s, err := newSource()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	testutil.RequireKernelFeature(t, s.vmas != nil, "task_vma iterators of one process (Linux 6.1)")
	real, err := fileVMAs(s.vmas, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	maps, err := elfsym.ExecutableMappings(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if len(maps) == 0 {
		t.Fatal("no executable mappings in /proc/self/maps")
	}
	for _, m := range maps {
		k, ok := real[m.Start]
		if !ok {
			t.Errorf("%s at %#x: not listed by the iterator (%d mappings listed)", m.Path, m.Start, len(real))
			continue
		}
		var st unix.Stat_t
		if err := unix.Stat(m.HostPath, &st); err != nil {
			t.Fatal(err)
		}
		if want := (fileKey{unix.Major(uint64(st.Dev)), unix.Minor(uint64(st.Dev)), uint64(st.Ino)}); k != want {
			t.Errorf("%s: the iterator says %+v, stat %+v", m.Path, k, want)
		}
	}
	// A process that does not exist has no mappings (pid_max is 2^22).
	if none, err := fileVMAs(s.vmas, 1<<30); err != nil || len(none) != 0 {
		t.Errorf("a process that does not exist: %d mappings, %v", len(none), err)
	}
}

// requireEvents skips t where the events programs cannot be attached, or
// (in a guest under multi-threaded TCG) must not be: attaching and
// detaching the raw tracepoints on sys_enter and sys_exit switches the
// static key in the kernel's system call path, which x86-64 patches
// through an int3 that the emulator's other vCPU can still run after it
// is gone (a 6.12 guest died so: "Oops: int3" in syscall_trace_enter);
// see testutil.SkipOnMTTCG.
func requireEvents(t testing.TB) {
	t.Helper()
	probetest.RequireBPF(t)
	testutil.SkipOnMTTCG(t)
}
