//go:build linux

package elfsym

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/multiprobe/multiprobe/internal/testprogs"
)

// TestExecutableMappingsChroot: a chrooted process's files are named as
// the process names them, and HostPath opens each (the maps give them from
// this root: through /proc/PID/root they would be under the chroot
// twice); a file deleted since it was mapped is reached through
// map_files.
func TestExecutableMappingsChroot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chroot needs root")
	}
	root := testprogs.ContainerRoot(t, testprogs.MallocsTarget(t))
	cmd := testprogs.ContainerCommand(root, "target", "-wait", "1", "1")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { in.Close(); cmd.Process.Kill(); cmd.Wait() }()
	if _, err := out.Read(make([]byte, 6)); err != nil { // "ready\n"
		t.Fatal(err)
	}
	var libc string
	check := func(deleted bool) {
		t.Helper()
		maps, err := ExecutableMappings(cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		if len(maps) < 2 || maps[0].Path != "/bin/target" {
			t.Fatalf("maps of a process chrooted into %s: %+v, want /bin/target first", root, maps)
		}
		for _, m := range maps {
			if strings.HasPrefix(m.Path, root) {
				t.Errorf("%s: named from this process's root, not the process's", m.Path)
			}
			fi, err := os.Stat(m.HostPath)
			if err != nil {
				t.Errorf("%s: HostPath %s: %v", m.Path, m.HostPath, err)
				continue
			}
			if ino := fi.Sys().(*syscall.Stat_t).Ino; ino != m.Inode {
				t.Errorf("%s: HostPath %s is inode %d, the maps say %d", m.Path, m.HostPath, ino, m.Inode)
			}
			if strings.HasPrefix(filepath.Base(m.Path), "libc.so") {
				libc = m.Path
				if m.Deleted != deleted || deleted != strings.Contains(m.HostPath, "/map_files/") {
					t.Errorf("%s: Deleted %v, HostPath %s", m.Path, m.Deleted, m.HostPath)
				}
			}
		}
	}
	check(false)
	if libc == "" {
		t.Fatal("no libc mapped")
	}
	if err := os.Remove(filepath.Join(root, libc)); err != nil {
		t.Fatal(err)
	}
	check(true)
}
