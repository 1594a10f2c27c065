package probetest_test

import (
	"os/exec"

	"github.com/multiprobe/multiprobe/probetest"
)

// Start runs a command stopped at its first instruction: attach, then
// Resume, and no call is missed.
func ExampleStart() {
	p, err := probetest.Start(exec.Command("/bin/sh", "-c", "exit 3"))
	if err != nil {
		return // not root: no ptrace
	}
	// ... attach probes with p.PID() as the filter ...
	if err := p.Resume(); err != nil {
		return
	}
	status, _ := p.Wait()
	_ = status // 3
}
