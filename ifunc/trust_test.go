//go:build linux

package ifunc_test

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/multiprobe/multiprobe/elfsym"
	"github.com/multiprobe/multiprobe/ifunc"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/probetest"
)

// canarySource is a library with an IFUNC whose constructor writes the
// user it runs as to the file MARKER. It calls the IFUNC through a hidden
// alias, as glibc does its own: through an IRELATIVE relocation.
const canarySource = `#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int impl(void) { return 42; }
static int (*resolve_canary(void))(void) { return impl; }
int canary(void) __attribute__((ifunc("resolve_canary")));
__attribute__((visibility("hidden"))) int canary_local(void) __attribute__((ifunc("resolve_canary")));
int call_canary(void) { return canary_local(); }

__attribute__((constructor)) static void mark(void)
{
	char buf[16];
	int fd = open(MARKER, O_WRONLY | O_CREAT | O_TRUNC, 0666);
	if (fd >= 0) {
		int n = snprintf(buf, sizeof buf, "%d", (int)geteuid());
		write(fd, buf, n);
		close(fd);
	}
}
`

// buildCanary builds the canary library at lib, its constructor writing to
// marker (a path as the process that loads it sees it). It returns false
// in a test VM, which has no compiler: the host runs the canary's checks.
func buildCanary(t *testing.T, lib, marker string) bool {
	t.Helper()
	if testutil.InGuest() {
		return false
	}
	gcc, err := exec.LookPath("gcc")
	testutil.RequireTool(t, "gcc", err)
	src := filepath.Join(t.TempDir(), "canary.c")
	if err := os.WriteFile(src, []byte(canarySource), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(gcc, "-shared", "-fPIC", "-O1", fmt.Sprintf("-DMARKER=%q", marker), "-o", lib, src)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	return true
}

// resolverOf returns the address of the IFUNC symbol name in lib.
func resolverOf(t *testing.T, lib, name string) uint64 {
	t.Helper()
	sites, err := elfsym.Resolve(lib, name)
	if err != nil {
		t.Fatal(err)
	}
	if sites[0].Type != elf.STT_GNU_IFUNC {
		t.Fatalf("%s in %s is not an IFUNC", name, lib)
	}
	return sites[0].Address
}

// TestHelperUser checks who the helper runs a library's code as when
// multiprobe is root: a library's owner, or nobody for a root-owned file
// that others may write; root only for a file only root may write.
func TestHelperUser(t *testing.T) {
	probetest.RequireRoot(t)
	if testutil.InGuest() {
		t.Skip("a test VM has no compiler for the canary library; the host runs this test")
	}
	// Readable and writable by any user the helper may run as.
	dir, err := os.MkdirTemp("", "ifunc-helper-user")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		uid  int
		mode os.FileMode
		want int // the user the constructor ran as
	}{
		{"root's", 0, 0o755, 0},
		{"a user's", 4321, 0o755, 4321},
		{"root's, writable by all", 0, 0o777, 65534},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lib := filepath.Join(dir, fmt.Sprintf("libcanary-%d-%o.so", tc.uid, tc.mode))
			marker := lib + ".marker"
			buildCanary(t, lib, marker)
			if err := os.Chown(lib, tc.uid, 0); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(lib, tc.mode); err != nil {
				t.Fatal(err)
			}
			impls, err := ifunc.Resolve(lib, []uint64{resolverOf(t, lib, "canary")})
			if err != nil {
				t.Fatal(err)
			}
			if impls[0] == 0 {
				t.Error("no implementation")
			}
			got, err := os.ReadFile(marker)
			if err != nil {
				t.Fatalf("the constructor left no mark: %v", err)
			}
			if uid, _ := strconv.Atoi(string(got)); uid != tc.want {
				t.Errorf("the library's code ran as user %s, want %d", got, tc.want)
			}
		})
	}
}

// TestSitesInRoot resolves IFUNCs of libraries inside another process's
// root, as for a container: the implementations must be those that
// process's loader chose, read from its memory, and none of the
// libraries' code may run outside the container. The root is a plain
// directory, and an overlayfs mount as containers' are: before Linux 6.8,
// /proc/PID/maps shows such a file's lower layer's device, not the one
// fstat gives.
func TestSitesInRoot(t *testing.T) {
	probetest.RequireRoot(t) // chroot, mount
	target := testprogs.IFuncTarget(t)
	libc, err := elfsym.LookPath("libc.so.6")
	if err != nil {
		t.Fatal(err)
	}
	for _, overlay := range []bool{false, true} {
		t.Run(map[bool]string{false: "directory", true: "overlayfs"}[overlay], func(t *testing.T) {
			// The container: copies of the target, its loader and libc
			// at the paths they have here, and the canary library.
			layer := testprogs.Root(t, target, "/target")
			// Its constructor marks a file at this path inside the
			// container; run on the host, it would mark the same path
			// here.
			marker := fmt.Sprintf("/ifunc-canary-%d", os.Getpid())
			t.Cleanup(func() { os.Remove(marker) })
			canary := buildCanary(t, filepath.Join(layer, "libcanary.so"), marker)
			root := layer
			if overlay {
				root = mountOverlay(t, layer)
			}

			cmd := exec.Command("/target", "-wait", "0")
			if canary {
				cmd.Env = []string{"LD_PRELOAD=/libcanary.so"}
			}
			cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
			line := startTarget(t, cmd)
			pid := cmd.Process.Pid
			inRoot := fmt.Sprintf("/proc/%d/root", pid)
			if _, err := os.Stat(filepath.Join(root, marker)); canary && err != nil {
				t.Fatalf("the container's own process did not run the canary: %v", err)
			}

			// libc: strlen, strchr, memcpy and strstr, as the target
			// printed them. Some are in no IRELATIVE slot of libc's
			// (strstr; memcpy on arm64): the target's GOT has them.
			path := inRoot + libc
			sites, err := elfsym.Resolve(path, "strlen", "strchr", "memcpy", "strstr")
			if err != nil {
				t.Fatal(err)
			}
			moved := sitesIn(t, path, sites)
			base := libcBase(t, pid, libc)
			printed := strings.Fields(line)
			for i, name := range []string{"strlen", "strchr", "memcpy", "strstr"} {
				addr, err := strconv.ParseUint(strings.TrimPrefix(printed[i], "0x"), 16, 64)
				if err != nil {
					t.Fatal(err)
				}
				for j, s := range sites {
					if !hasName(s, name) || s.Type != elf.STT_GNU_IFUNC {
						continue
					}
					t.Logf("%s: %s (%s)", name, moved[j].Moved, moved[j].Note)
					// Sites may step past an instruction uprobes
					// refuse (ifunc.Entry), by less than EntryWindow.
					if want := addr - base; moved[j].Offset < want || moved[j].Offset-want >= ifunc.EntryWindow {
						t.Errorf("%s: offset %#x, the container's loader chose %#x (%s)", name, moved[j].Offset, want, moved[j].Note)
					}
					if moved[j].Moved != elfsym.MovedIFunc {
						t.Errorf("%s: %s (%s)", name, moved[j].Moved, moved[j].Note)
					}
				}
			}

			// The canary: found through its IRELATIVE slot, and never
			// run here.
			if !canary {
				return
			}
			path = inRoot + "/libcanary.so"
			sites, err = elfsym.Resolve(path, "canary")
			if err != nil {
				t.Fatal(err)
			}
			moved = sitesIn(t, path, sites)
			if moved[0].Moved != elfsym.MovedIFunc || moved[0].Offset == sites[0].Offset {
				t.Errorf("canary: offset %#x (resolver %#x): %s (%s)", moved[0].Offset, sites[0].Offset, moved[0].Moved, moved[0].Note)
			}
			if _, err := os.Stat(marker); err == nil {
				t.Errorf("the container's library ran on the host: %s exists", marker)
			}
		})
	}
}

// mountOverlay mounts an overlayfs with lower as its only lower layer and
// returns where, unmounted at the end of the test.
func mountOverlay(t *testing.T, lower string) string {
	t.Helper()
	dir := t.TempDir()
	upper, work, merged := filepath.Join(dir, "upper"), filepath.Join(dir, "work"), filepath.Join(dir, "merged")
	for _, d := range []string{upper, work, merged} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, upper, work)
	if err := syscall.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		if errors.Is(err, syscall.ENODEV) && testutil.InGuest() {
			t.Skip("this test VM's kernel has no overlayfs; the host runs this test")
		}
		t.Fatalf("mount overlay: %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(merged, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", merged, err)
		}
	})
	return merged
}

func hasName(s elfsym.Site, name string) bool {
	for _, n := range append([]string{s.Name}, s.Aliases...) {
		if base, _, _ := strings.Cut(n, "@"); base == name {
			return true
		}
	}
	return false
}
