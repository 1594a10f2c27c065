package testprogs

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Proc is a target process that talks over pipes, as every target here
// does: it prints "ready" once started, then waits for lines on stdin
// ("go" for the -wait targets, commands for the semaphore target). A test
// starts it before it attaches, so that no call is missed and the pid is
// known, and then tells it when to make its calls. The process is killed
// when the test ends.
type Proc struct {
	Cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

// Start runs path with args and waits for it to print "ready".
func Start(tb testing.TB, path string, args ...string) *Proc {
	tb.Helper()
	cmd := exec.Command(path, args...)
	in, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	p := &Proc{Cmd: cmd, in: in, out: bufio.NewReader(stdout)}
	tb.Cleanup(func() { in.Close(); cmd.Process.Kill(); cmd.Wait() })
	if line := p.Line(tb); line != "ready" {
		tb.Fatalf("%s printed %q first, want ready", path, line)
	}
	return p
}

// PID returns the process's pid.
func (p *Proc) PID() int { return p.Cmd.Process.Pid }

// Line reads the next line the process prints, without its newline.
func (p *Proc) Line(tb testing.TB) string {
	tb.Helper()
	line, err := p.out.ReadString('\n')
	if err != nil {
		tb.Fatalf("%s: reading its output: %v (read %q)", p.Cmd.Path, err, line)
	}
	return strings.TrimSuffix(line, "\n")
}

// Do sends the line cmd and returns the line the process answers.
func (p *Proc) Do(tb testing.TB, cmd string) string {
	tb.Helper()
	if _, err := fmt.Fprintln(p.in, cmd); err != nil {
		tb.Fatalf("%s: %v", p.Cmd.Path, err)
	}
	return p.Line(tb)
}

// Finish sends "go", closes stdin and waits for the process to exit; it
// fails tb unless the exit status is 0. It returns what the process
// printed after "ready", trimmed.
func (p *Proc) Finish(tb testing.TB) string {
	tb.Helper()
	fmt.Fprintln(p.in, "go")
	p.in.Close()
	rest, _ := io.ReadAll(p.out)
	if err := p.Cmd.Wait(); err != nil {
		tb.Fatalf("%s: %v (printed %q)", p.Cmd.Path, err, rest)
	}
	return strings.TrimSpace(string(rest))
}

// StartInPrivateMount runs a copy of the target at path, with args, in a
// mount namespace of its own (unshare -m) from a directory bind-mounted
// there only: its root directory is this process's, its mounts are not,
// and the path it runs from (returned) names nothing here. It waits for
// "ready" as Start does.
func StartInPrivateMount(tb testing.TB, path string, args ...string) (*Proc, string) {
	tb.Helper()
	if _, err := exec.LookPath("unshare"); err != nil {
		tb.Fatalf("unshare (util-linux) is needed: %v", err)
	}
	dir := tb.TempDir()
	src, mnt := filepath.Join(dir, "src"), filepath.Join(dir, "mnt")
	for _, d := range []string{src, mnt} {
		if err := os.Mkdir(d, 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, filepath.Base(path)), data, 0o755); err != nil {
		tb.Fatal(err)
	}
	inside := filepath.Join(mnt, filepath.Base(path))
	script := fmt.Sprintf("mount --bind %s %s && exec %s \"$@\"", src, mnt, inside)
	p := Start(tb, "unshare", append([]string{"-m", "--propagation", "private", "sh", "-c", script, "sh"}, args...)...)
	if _, err := os.Stat(inside); err == nil {
		tb.Fatalf("%s is there outside the process's mount namespace too", inside)
	}
	return p, inside
}
