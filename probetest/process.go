package probetest

import (
	"os/exec"
	"testing"

	"github.com/multiprobe/multiprobe/internal/stopped"
)

// A Process is a command started by [Start], stopped at its first
// instruction until [Process.Resume]; see its methods for the rest.
type Process = stopped.Process

// Start starts cmd (not started yet; its Stdin, Stdout, Env and the rest
// are the caller's) stopped before its first instruction, through ptrace:
// the program is loaded, its libraries are not yet, and it has made no
// call. Attach with its PID as the filter, then call [Process.Resume]: no
// call is missed, and no other process's calls are seen.
//
// The calling goroutine is locked to its thread until Resume or
// [Process.Kill] (the tracer of a ptrace'd process is a thread), which must
// be called from the same goroutine. The process is killed if that thread
// exits first (Pdeathsig), so that a killed test leaves no process behind.
// Start needs CAP_SYS_PTRACE, which root has; it sets cmd.SysProcAttr's
// Ptrace and Pdeathsig, and keeps the rest.
func Start(cmd *exec.Cmd) (*Process, error) {
	p, err := stopped.Start(cmd)
	if err != nil {
		return nil, errorf("%w", err)
	}
	return p, nil
}

// ExitStatus is the status a shell reports for a command whose Wait
// returned err: 0, its exit code, or 128 plus the signal that killed it.
// For an error that is not an exit it returns -1 and the error.
func ExitStatus(err error) (int, error) { return stopped.ExitStatus(err) }

// StartStopped is [Start] for a test: it starts name with args stopped,
// fails tb if it cannot, and kills the process when the test ends, if it
// is still running then.
func StartStopped(tb testing.TB, name string, args ...string) *Process {
	tb.Helper()
	p, err := Start(exec.Command(name, args...))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		p.Kill()
		<-p.Done()
	})
	return p
}
