package testprogs

import (
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// ContainerRoot makes a root directory for the program at path as a
// container's image would hold it: the program at /bin/NAME, and a copy
// of each file it maps when it runs (its loader and libraries) at the
// path it maps it from, and its loader at the path its ELF header asks
// for; so each container has its own copy of libc, another inode. The
// program must take -wait (print "ready", wait for a line, exit).
func ContainerRoot(tb testing.TB, path string) string {
	tb.Helper()
	root := tb.TempDir()
	put := func(src, at string) {
		dst := filepath.Join(root, at)
		if _, err := os.Stat(dst); err == nil {
			return
		}
		data, err := os.ReadFile(src)
		if err != nil {
			tb.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(dst, data, 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	put(path, "/bin/"+filepath.Base(path))
	p := Start(tb, path, "-wait")
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", p.PID()))
	if err != nil {
		tb.Fatal(err)
	}
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", p.PID()))
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(string(maps), "\n") {
		// start-end perms offset dev inode path
		if f := strings.Fields(line); len(f) == 6 && strings.HasPrefix(f[5], "/") && f[5] != exe {
			put(f[5], f[5])
		}
	}
	p.Cmd.Process.Kill()
	p.Cmd.Wait()
	f, err := elf.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			interp, err := io.ReadAll(prog.Open())
			if err != nil {
				tb.Fatal(err)
			}
			loader, err := filepath.EvalSymlinks(strings.TrimRight(string(interp), "\x00"))
			if err != nil {
				tb.Fatal(err)
			}
			put(loader, strings.TrimRight(string(interp), "\x00"))
		}
	}
	return root
}

// ContainerCommand is the command that runs /bin/NAME args in root (see
// [ContainerRoot]) as a container's first process: chrooted, in a mount
// namespace of its own.
func ContainerCommand(root, name string, args ...string) *exec.Cmd {
	cmd := exec.Command("/bin/"+name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root, Unshareflags: syscall.CLONE_NEWNS}
	cmd.Dir = "/"
	return cmd
}
