package testutil

import (
	"errors"
	"os"
	"os/exec"
	"sync"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/multiprobe/multiprobe/internal/bpfsys"
)

// InCI reports whether the tests run in CI (CI=true). There, a test that
// cannot get what it needs fails instead of skipping: a CI run that skipped
// every BPF test would be green and prove nothing.
func InCI() bool {
	v := os.Getenv("CI")
	return v == "true" || v == "1"
}

// Unavailable skips t, or fails it in CI, with the reason.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	if InCI() {
		t.Fatalf("CI=true and a requirement is missing: "+format, args...)
	}
	t.Skipf(format, args...)
}

// RequireRoot skips (or, in CI, fails) t unless it runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Unavailable(t, "test needs root (CAP_BPF and CAP_PERFMON)")
	}
}

var (
	bpfOnce sync.Once
	bpfErr  error
)

// RequireBPF skips (or, in CI, fails) t unless this process can load a BPF
// program. It removes the memlock limit once, for kernels before 5.11 that
// charge BPF memory to it.
func RequireBPF(t testing.TB) {
	t.Helper()
	RequireRoot(t)
	bpfOnce.Do(func() {
		if err := bpfsys.RaiseMemlock(); err != nil {
			bpfErr = err
			return
		}
		prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
			Type: ebpf.SocketFilter,
			Instructions: asm.Instructions{
				asm.Mov.Imm(asm.R0, 0),
				asm.Return(),
			},
			License: "GPL",
		})
		if err != nil {
			bpfErr = err
			return
		}
		prog.Close()
	})
	if bpfErr != nil {
		Unavailable(t, "cannot load a BPF program: %v", bpfErr)
	}
}

// GuestEnv is set to 1 by the VM runner (.ci/oldkernel/run) in the guests
// it boots. A guest is there to test the kernel: it has no compilers, and
// runs the C targets the host built for it.
const GuestEnv = "MULTIPROBE_GUEST"

// InGuest reports whether the tests run in a VM runner's guest.
func InGuest() bool { return os.Getenv(GuestEnv) == "1" }

// RequireTool skips (or, in CI, fails) t unless err is nil; err comes from
// looking up or building a tool the test needs, such as gcc. In a guest, a
// tool that is not there skips the test even in CI: the host, which has
// every tool, runs it.
func RequireTool(t testing.TB, name string, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, exec.ErrNotFound) {
		if InGuest() {
			t.Skipf("%s not found: a test VM has no build tools; the host runs this test", name)
		}
		Unavailable(t, "%s not found: %v (run .ci/run or install it)", name, err)
	}
	Unavailable(t, "%s: %v", name, err)
}
