package probetest

import (
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/multiprobe/multiprobe/internal/bpfsys"
	"github.com/multiprobe/multiprobe/kernelprobe"
)

// InCI reports whether the tests run in CI, as the environment variable
// CI=true (or 1) says, which GitHub Actions, GitLab CI and most others set.
// There a test that cannot get what it needs fails instead of skipping.
func InCI() bool {
	v := os.Getenv("CI")
	return v == "true" || v == "1"
}

// Unavailable skips tb with the reason, or fails it under CI=true.
func Unavailable(tb testing.TB, format string, args ...any) {
	tb.Helper()
	if InCI() {
		tb.Fatalf("CI=true and a requirement is missing: "+format, args...)
	}
	tb.Skipf(format, args...)
}

// RequireRoot skips tb (fails it under CI=true) unless the test runs as
// root.
func RequireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		Unavailable(tb, "test needs root (or CAP_BPF, CAP_PERFMON and CAP_SYS_PTRACE): run go test as root, or with sudo -E")
	}
}

var (
	bpfOnce sync.Once
	bpfErr  error
)

// RequireBPF skips tb (fails it under CI=true) unless this process can load
// a BPF program. The first call raises the memlock limit on kernels before
// 5.11, which charge BPF memory to it.
func RequireBPF(tb testing.TB) {
	tb.Helper()
	RequireRoot(tb)
	bpfOnce.Do(func() {
		if bpfErr = bpfsys.RaiseMemlock(); bpfErr != nil {
			return
		}
		prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
			Type:         ebpf.SocketFilter,
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
			License:      "GPL",
		})
		if err != nil {
			bpfErr = err
			return
		}
		prog.Close()
	})
	if bpfErr != nil {
		Unavailable(tb, "cannot load a BPF program: %v", bpfErr)
	}
}

// A Feature is a kernel feature a test can require.
type Feature struct {
	name string
	has  func(kernelprobe.Features) bool
}

// String returns the feature's name and the Linux release that brought it.
func (f Feature) String() string { return f.name }

// The features of [kernelprobe.Features] a test can require.
var (
	UprobeMulti          = Feature{"uprobe_multi links (Linux 6.6)", func(f kernelprobe.Features) bool { return f.UprobeMulti }}
	UprobeMultiPIDFilter = Feature{"uprobe_multi's whole-process pid filter (Linux 6.10)", func(f kernelprobe.Features) bool { return f.UprobeMultiPIDFilter }}
	UprobeSession        = Feature{"uprobe sessions (Linux 6.13)", func(f kernelprobe.Features) bool { return f.UprobeSession }}
	Cookies              = Feature{"BPF cookies (Linux 5.15)", func(f kernelprobe.Features) bool { return f.Cookies }}
	RefCtrOffset         = Feature{"uprobe ref-counter offsets (Linux 4.20)", func(f kernelprobe.Features) bool { return f.RefCtrOffset }}
)

// RequireFeature skips tb (fails it under CI=true) unless the kernel has
// every feature in fs, as [kernelprobe.Detect] finds them (and
// MULTIPROBE_FORCE forces them off). A test that must run on older kernels
// too should instead take the path the kernel has.
func RequireFeature(tb testing.TB, fs ...Feature) {
	tb.Helper()
	f, err := kernelprobe.Detect()
	if err != nil {
		tb.Fatalf("probetest: %v", err)
	}
	for _, feat := range fs {
		if !feat.has(f) {
			Unavailable(tb, "kernel %s has no %s", f.Release, feat)
		}
	}
}

// errorf is fmt.Errorf with the package's prefix.
func errorf(format string, args ...any) error {
	return fmt.Errorf("probetest: "+format, args...)
}
