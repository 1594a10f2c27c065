package stopped

import (
	"fmt"
	"os/exec"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// startTraced starts cmd under ptrace and waits for the stop after exec,
// with the calling goroutine locked to its thread (the tracer).
func startTraced(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Ptrace = true
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	runtime.LockOSThread()
	if err := cmd.Start(); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("starting %s: %w", cmd.Path, err)
	}
	pid := cmd.Process.Pid
	var ws unix.WaitStatus
	if _, err := unix.Wait4(pid, &ws, 0, nil); err != nil || !ws.Stopped() {
		cmd.Process.Kill()
		cmd.Wait()
		runtime.UnlockOSThread()
		return fmt.Errorf("starting %s: it did not stop after exec (status %v): %v", cmd.Path, ws, err)
	}
	return nil
}

// detach ends the trace, which lets a stopped tracee run.
func detach(pid int) error { return unix.PtraceDetach(pid) }
