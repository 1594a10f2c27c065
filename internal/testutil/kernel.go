package testutil

import (
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/multiprobe/multiprobe/probetest"
)

// ExpectPathEnv names the environment variable through which a test run
// states which attach path the kernel under test must take
// ("uprobe_multi" or "perf_event"). The old-kernel runner sets it to
// perf_event, so that a 6.1 kernel that somehow took the multi path, or a
// test that forced nothing, is caught.
const ExpectPathEnv = "MULTIPROBE_EXPECT_PATH"

// ExpectPath fails t if the run expects another attach path than got
// (the String of a kernelprobe.Path).
func ExpectPath(t testing.TB, got string) {
	t.Helper()
	if want := os.Getenv(ExpectPathEnv); want != "" && want != got {
		t.Fatalf("attach path %s, but this run expects %s (%s)", got, want, ExpectPathEnv)
	}
}

// ExpectFeaturesEnv names the statement of what the kernel under test has,
// which the VM runner writes for each kernel series ("cookies=0
// uprobe_multi=0 ..."); kernelprobe's TestDetect fails unless detection
// finds exactly that.
const ExpectFeaturesEnv = "MULTIPROBE_EXPECT_FEATURES"

// RequireKernelFeature skips t when the kernel lacks a feature that the
// test exercises, if the run states what its kernel has (ExpectFeaturesEnv,
// which TestDetect holds detection to, so a lack is a stated one) or says
// it targets an older kernel (ExpectPathEnv=perf_event); otherwise a
// missing feature is a missing requirement, which fails in CI.
func RequireKernelFeature(t testing.TB, have bool, what string) {
	t.Helper()
	if have {
		return
	}
	if os.Getenv(ExpectFeaturesEnv) != "" || os.Getenv(ExpectPathEnv) == "perf_event" {
		t.Skipf("kernel has no %s (a kernel series without it)", what)
	}
	probetest.Unavailable(t, "kernel has no %s", what)
}

// KernelCountsVerified reports whether the kernel reports how many
// instructions it verified for a program (Linux 5.16), which a test can
// then expect to be more than 0.
func KernelCountsVerified(tb testing.TB) bool {
	tb.Helper()
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SocketFilter, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}})
	if err != nil {
		tb.Fatal(err)
	}
	defer p.Close()
	info, err := p.Info()
	if err != nil {
		tb.Fatal(err)
	}
	_, ok := info.VerifiedInstructions()
	return ok
}
