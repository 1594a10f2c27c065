package elfsym

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/multiprobe/multiprobe/internal/fds"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/probetest"
	"golang.org/x/sys/unix"
)

// TestProcRootConfined looks files up inside another process's root, as
// multiprobe does for a container's: a chroot holding a copy of a host
// program and three ways out of it (an absolute symbolic link to a host
// file, a relative one climbing past the root, and ".." in the name). Each
// way out must find the container's own file or nothing, never the
// host's.
func TestProcRootConfined(t *testing.T) {
	if os.Geteuid() != 0 {
		probetest.Unavailable(t, "chroot needs root")
	}
	host, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	host, _ = filepath.EvalSymlinks(host)
	dir := t.TempDir()
	for _, d := range []string{"bin", "lib"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The container's own program, a copy of the host's, and a second
	// copy the escapes below find inside the root if they resolve there.
	data, err := os.ReadFile(host)
	if err != nil {
		t.Fatal(err)
	}
	own := filepath.Join(dir, "bin", "own")
	if err := os.WriteFile(own, data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(host)), 0o755); err != nil {
		t.Fatal(err)
	}
	inside := filepath.Join(dir, host) // the container's file at the host's path
	if err := os.WriteFile(inside, data, 0o755); err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Symlink(host, filepath.Join(dir, "lib", "abs.so")))
	must(os.Symlink("../../../../../../.."+host, filepath.Join(dir, "lib", "rel.so")))
	must(os.Symlink("/no/such/file", filepath.Join(dir, "lib", "gone.so")))

	// A process whose root is dir: /proc/PID/root is the container's view.
	// It must run without a dynamic loader there: a static one.
	gcc, err := exec.LookPath("gcc")
	testutil.RequireTool(t, "gcc", err)
	src := filepath.Join(t.TempDir(), "pause.c")
	must(os.WriteFile(src, []byte("#include <unistd.h>\nint main(void) { pause(); return 0; }\n"), 0o644))
	if out, err := exec.Command(gcc, "-static", "-O1", "-o", filepath.Join(dir, "bin", "pause"), src).CombinedOutput(); err != nil {
		t.Fatalf("gcc -static: %v\n%s", err, out)
	}
	cmd := exec.Command("/bin/pause")
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: dir}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	root := "/proc/" + strconv.Itoa(cmd.Process.Pid) + "/root"

	sameFile := func(f *os.File, path string) bool {
		var a, b unix.Stat_t
		if unix.Fstat(int(f.Fd()), &a) != nil || unix.Stat(path, &b) != nil {
			return false
		}
		return a.Dev == b.Dev && a.Ino == b.Ino
	}
	for _, tc := range []struct {
		name string
		path string
		want string // the file it must open, "" for none
	}{
		{"own file", root + "/bin/own", own},
		{"absolute link", root + "/lib/abs.so", inside},
		{"relative link past the root", root + "/lib/rel.so", inside},
		{"dot-dot in the name", root + "/../../../../.." + host, inside},
		{"dangling link", root + "/lib/gone.so", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Open(tc.path)
			if tc.want == "" {
				if err == nil {
					f.Close()
					t.Fatal("opened")
				}
				if !errors.Is(err, ErrNotFound) {
					t.Errorf("%v, want ErrNotFound", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			f.Close()
			// Open reads through a descriptor it closes; check the file
			// the lookup reaches with the same confined open.
			g, err := openConfined(tc.path)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			if !sameFile(g, tc.want) {
				t.Errorf("%s opened another file than %s", tc.path, tc.want)
			}
			if sameFile(g, host) {
				t.Errorf("%s opened the host's %s", tc.path, host)
			}
		})
	}
	// A bare name is looked up in the container's library directories.
	if p, err := LookPathIn(root, "abs.so"); err != nil {
		t.Errorf("LookPathIn(abs.so): %v", err)
	} else if g, err := openConfined(p); err != nil || !sameFile(g, inside) {
		t.Errorf("LookPathIn(abs.so) = %s, which does not open the container's file (%v)", p, err)
	}
}

func openConfined(path string) (*os.File, error) { return fds.OpenRegular(path) }

// TestNoFunctionsMessage tells a file without symbol tables from one whose
// tables name no functions (a data-only library).
func TestNoFunctionsMessage(t *testing.T) {
	gcc, err := exec.LookPath("gcc")
	testutil.RequireTool(t, "gcc", err)
	dir := t.TempDir()
	src := filepath.Join(dir, "data.c")
	if err := os.WriteFile(src, []byte("int data_only = 1;\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(dir, "libdata.so")
	if out, err := exec.Command(gcc, "-shared", "-fPIC", "-nostdlib", "-o", lib, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	_, err = Resolve(lib, "f*")
	var nm *NoMatchError
	if !errors.As(err, &nm) || nm.Stripped || !strings.Contains(err.Error(), "data-only") {
		t.Errorf("data-only library: %v, want a no-match error that says it names no functions", err)
	}
}
