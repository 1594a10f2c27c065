package pidfilter_test

import (
	"bufio"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/multiprobe/multiprobe/pidfilter"
	"github.com/multiprobe/multiprobe/probetest"
)

// TestFollowForks: a process that a process in the set forks joins the
// set before it runs, and leaves it when it exits; the parent, acquired
// by a holder, stays; a process outside the set that forks adds nothing.
func TestFollowForks(t *testing.T) {
	probetest.RequireBPF(t)
	f, err := pidfilter.NewFilter(64)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// A shell that, told to, starts a child, says its pid, and waits for
	// it. (A child of a shell without job control reads /dev/null: it
	// sleeps, until the test kills it.)
	start := func() (*exec.Cmd, *bufio.Scanner, func(string)) {
		sh := exec.Command("/bin/sh", "-c", `read x; sleep 60 & echo $!; wait`)
		in, err := sh.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		out, err := sh.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := sh.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sh.Process.Kill(); sh.Wait() })
		return sh, bufio.NewScanner(out), func(s string) { fmt.Fprintln(in, s) }
	}
	sh, out, say := start()
	other, otherOut, otherSay := start()
	if err := f.Acquire(sh.Process.Pid); err != nil {
		t.Fatal(err)
	}
	fk, err := f.FollowForks()
	if err != nil {
		t.Fatal(err)
	}
	defer fk.Close()
	childOf := func(out *bufio.Scanner, say func(string)) int {
		say("go")
		if !out.Scan() {
			t.Fatal("the shell said no child pid")
		}
		pid, err := strconv.Atoi(strings.TrimSpace(out.Text()))
		if err != nil {
			t.Fatal(err)
		}
		return pid
	}
	child := childOf(out, say)
	stranger := childOf(otherOut, otherSay)
	pids, err := f.PIDs()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(pids, child) || !slices.Contains(pids, sh.Process.Pid) || slices.Contains(pids, stranger) {
		t.Errorf("set %v: want the shell %d and its child %d, not %d (another's)", pids, sh.Process.Pid, child, stranger)
	}
	if n, err := f.Count(child); err != nil || n != 0 {
		t.Errorf("Count(child) = %d, %v; want 0: no holder holds it", n, err)
	}
	syscall.Kill(child, syscall.SIGKILL) // the shell's wait returns
	syscall.Kill(stranger, syscall.SIGKILL)
	sh.Wait()
	other.Wait()
	pids, err = f.PIDs()
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(pids, child) || !slices.Contains(pids, sh.Process.Pid) {
		t.Errorf("after the child's exit the set is %v: want the shell %d (held) and not the child %d", pids, sh.Process.Pid, child)
	}
	if err := f.Release(sh.Process.Pid); err != nil {
		t.Fatal(err)
	}
}
