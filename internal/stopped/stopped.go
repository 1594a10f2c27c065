// Package stopped starts a command stopped before its first instruction,
// through ptrace, so that probes can be attached with its pid as the
// filter before it makes a single call, and then lets it run. The CLI's
// count and latency and package probetest share it.
package stopped

import (
	"errors"
	"fmt"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

// A Process is a command started by [Start], stopped at its first
// instruction until [Process.Resume].
type Process struct {
	// Cmd is the command as given to Start.
	Cmd *exec.Cmd

	mu      sync.Mutex
	resumed bool
	done    chan struct{}
	err     error // Cmd.Wait's, once done is closed
}

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
	if err := startTraced(cmd); err != nil {
		return nil, err
	}
	return &Process{Cmd: cmd, done: make(chan struct{})}, nil
}

// PID returns the process's id.
func (p *Process) PID() int { return p.Cmd.Process.Pid }

// Resume lets the process run. Call it from the goroutine that called
// Start, once.
func (p *Process) Resume() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.resumed {
		return fmt.Errorf("%s: resumed already", p.Cmd.Path)
	}
	err := detach(p.PID())
	p.resumed = true
	runtime.UnlockOSThread()
	if err != nil {
		p.Cmd.Process.Kill()
		go p.wait()
		return fmt.Errorf("resuming %s: %w", p.Cmd.Path, err)
	}
	go p.wait()
	return nil
}

func (p *Process) wait() {
	p.err = p.Cmd.Wait()
	close(p.done)
}

// Done is closed when the process has exited, after Resume.
func (p *Process) Done() <-chan struct{} { return p.done }

// Wait waits for the process, after Resume, and returns its exit status as
// a shell reports it: its exit code, or 128 plus the signal that killed
// it. err is not nil only when the status is unknown.
func (p *Process) Wait() (status int, err error) {
	p.mu.Lock()
	resumed := p.resumed
	p.mu.Unlock()
	if !resumed {
		return -1, fmt.Errorf("%s: Wait before Resume", p.Cmd.Path)
	}
	<-p.done
	return ExitStatus(p.err)
}

// Kill kills the process. Before Resume, call it from the goroutine that
// called Start.
func (p *Process) Kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.Cmd.Process.Kill()
	if !p.resumed {
		p.resumed = true
		detach(p.PID())
		runtime.UnlockOSThread()
		go p.wait()
	}
}

// ExitStatus is the status a shell reports for a command whose Wait
// returned err: 0, its exit code, or 128 plus the signal that killed it.
// For an error that is not an exit it returns -1 and the error.
func ExitStatus(err error) (int, error) {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal()), nil
		}
		return ee.ExitCode(), nil
	}
	return -1, err
}
