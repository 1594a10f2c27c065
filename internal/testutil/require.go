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
