//go:build !linux

package stopped

import (
	"fmt"
	"os/exec"
	"runtime"

	"github.com/cilium/ebpf"
)

var errNotLinux = fmt.Errorf("starting a command stopped at its first instruction on %s: %w", runtime.GOOS, ebpf.ErrNotSupported)

func startTraced(cmd *exec.Cmd) error { return errNotLinux }

func detach(pid int) error { return errNotLinux }
