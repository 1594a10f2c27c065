package testutil

import (
	"errors"
	"os"
	"os/exec"
	"testing"

	"github.com/multiprobe/multiprobe/probetest"
)

// GuestEnv is set to 1 by the VM runner (.ci/oldkernel/run) in the guests
// it boots. A guest is there to test the kernel: it has no compilers, and
// runs the C targets the host built for it.
const GuestEnv = "MULTIPROBE_GUEST"

// InGuest reports whether the tests run in a VM runner's guest.
func InGuest() bool { return os.Getenv(GuestEnv) == "1" }

// GuestMTTCGEnv is set to 1 by the VM runner when its guest runs under
// QEMU's multi-threaded TCG with more than one vCPU.
const GuestMTTCGEnv = "MULTIPROBE_GUEST_MTTCG"

// SkipOnMTTCG skips t in a guest that runs under multi-threaded TCG with
// more than one vCPU, where code the kernel rewrites while another vCPU
// runs it is not always seen rewritten. Two kinds of tests meet it:
//   - A Go program probed inside its functions (past the stack check, on
//     return instructions) dies now and then: on x86-64, returning to the
//     same bad address (0xff0000000094779c) on every kernel tried, 5.10 to
//     7.2, about one run in five with entry and return probes together;
//     on arm64 (6.12) with "unexpected return pc", 10 of 16 runs with entry
//     probes alone. With one vCPU, single-threaded TCG, or no emulation
//     (the host) it never does (0 of 48 runs on x86-64, 0 of 16 on arm64).
//   - An fentry or fexit attached to a BPF program that runs meanwhile on
//     the other vCPU: the kernel patches the program's first instruction
//     (on x86-64 through an int3 it then removes), and the guest panicked
//     in the program on that int3 (x86-64 6.12) or on a branch to a freed
//     trampoline (arm64 6.12); under single-threaded TCG it ran clean.
//
// It is the emulator's, not the kernel's nor multiprobe's, so such a test
// skips there, and CI runs it in guests under single-threaded TCG instead
// (OLDKERNEL_TCG_THREAD=single).
func SkipOnMTTCG(t testing.TB) {
	t.Helper()
	if InGuest() && os.Getenv(GuestMTTCGEnv) == "1" {
		t.Skip("guest under multi-threaded TCG, where code the kernel rewrites as another vCPU runs it is not always seen rewritten (see testutil.SkipOnMTTCG); CI runs this test under single-threaded TCG")
	}
}

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
		probetest.Unavailable(t, "%s not found: %v (run .ci/run or install it)", name, err)
	}
	probetest.Unavailable(t, "%s: %v", name, err)
}
