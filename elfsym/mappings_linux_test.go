//go:build linux

package elfsym

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/internal/testutil"
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

// TestExecutableMappingsSameInode: a process in a mount namespace of its
// own maps a file of a tmpfs there and deletes it; this process has
// another tmpfs at the same path, with a file of the same inode number
// at the same name (a new tmpfs numbers its files from 2). HostPath must
// not be that file: the process's file is reached through map_files,
// whose device and inode are the mapping's. Before, the inode number
// alone matched, and HostPath named this process's file.
func TestExecutableMappingsSameInode(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounts need root")
	}
	unshare, err := exec.LookPath("unshare")
	testutil.RequireTool(t, "unshare", err)
	py, err := exec.LookPath("python3")
	testutil.RequireTool(t, "python3", err)
	dir := t.TempDir()
	lib := filepath.Join(dir, "lib.so")
	mapper := `import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
m = mmap.mmap(fd, 0, prot=mmap.PROT_READ | mmap.PROT_EXEC)
os.close(fd)
os.unlink(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()`
	p := testprogs.Start(t, unshare, "-m", "--propagation", "private", "sh", "-c",
		`mount -t tmpfs none "$1" && head -c 8192 /dev/urandom > "$1/lib.so" && exec "$2" -S -c "$3" "$1/lib.so"`, "sh", dir, py, mapper)
	if err := syscall.Mount("none", dir, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	defer syscall.Unmount(dir, syscall.MNT_DETACH)
	if err := os.WriteFile(lib, []byte("another file"), 0o755); err != nil {
		t.Fatal(err)
	}
	var ours syscall.Stat_t
	if err := syscall.Stat(lib, &ours); err != nil {
		t.Fatal(err)
	}
	maps, err := ExecutableMappings(p.Cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range maps {
		if m.Path != lib {
			continue
		}
		if m.Inode != ours.Ino {
			t.Fatalf("the process's file is inode %d, ours %d: the test needs them alike", m.Inode, ours.Ino)
		}
		var st syscall.Stat_t
		if err := syscall.Stat(m.HostPath, &st); err != nil {
			t.Fatal(err)
		}
		if !m.Deleted || !strings.Contains(m.HostPath, "/map_files/") || st.Dev == ours.Dev || uint64(st.Dev) != m.HostDev || st.Ino != m.HostIno {
			t.Errorf("HostPath %s (dev %d, Deleted %v, HostDev %d HostIno %d), want the process's own file through map_files, not ours (dev %d)",
				m.HostPath, st.Dev, m.Deleted, m.HostDev, m.HostIno, ours.Dev)
		}
		p.Finish(t)
		return
	}
	t.Fatalf("%s not among the process's mappings: %+v", lib, maps)
}
