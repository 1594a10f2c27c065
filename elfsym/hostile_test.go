package elfsym

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/multiprobe/multiprobe/internal/fds"
	"github.com/multiprobe/multiprobe/internal/testprogs"
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

// TestNoFunctionsMessage tells a stripped file (no .symtab: only what its
// .dynsym exports can be found) from one whose tables name no functions
// (a data-only library).
func TestNoFunctionsMessage(t *testing.T) {
	gcc, err := exec.LookPath("gcc")
	testutil.RequireTool(t, "gcc", err)
	strip, err := exec.LookPath("strip")
	testutil.RequireTool(t, "strip", err)
	dir := t.TempDir()
	build := func(name, src string, strips bool, args ...string) string {
		c := filepath.Join(dir, name+".c")
		if err := os.WriteFile(c, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(dir, name)
		if msg, err := exec.Command(gcc, append(args, "-o", out, c)...).CombinedOutput(); err != nil {
			t.Fatalf("gcc: %v\n%s", err, msg)
		}
		if strips {
			if msg, err := exec.Command(strip, out).CombinedOutput(); err != nil {
				t.Fatalf("strip: %v\n%s", err, msg)
			}
		}
		return out
	}
	for _, tc := range []struct {
		name     string
		path     string
		stripped bool
		searched bool // some function was searched
		says     string
	}{
		{"data-only library", build("libdata.so", "int data_only = 1;\n", false, "-shared", "-fPIC", "-nostdlib"),
			false, false, "data-only"},
		{"stripped program that only imports", build("imports", "#include <stdio.h>\nint main(void) { return puts(\"x\"); }\n", true),
			true, false, "exports no function"},
		{"stripped library", build("libexports.so", "static int hidden(int x) { return x + 1; }\nint exported(int x) { return hidden(x); }\n", true, "-shared", "-fPIC"),
			true, true, "only the functions its .dynsym exports"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Resolve(tc.path, "hidden")
			var nm *NoMatchError
			if !errors.As(err, &nm) {
				t.Fatalf("got %v, want a NoMatchError", err)
			}
			if nm.Stripped != tc.stripped || (nm.Searched > 0) != tc.searched || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("got %v (Stripped %v, Searched %d), want Stripped %v, some searched %v, and a message saying %q",
					err, nm.Stripped, nm.Searched, tc.stripped, tc.searched, tc.says)
			}
			if !strings.HasPrefix(err.Error(), tc.path+": ") {
				t.Errorf("%v: want the message to start with the file's path", err)
			}
		})
	}
}

// TestOpenFile checks that OpenFile reads the file its descriptor refers
// to, not what its path names by then, that errors name the path the file
// was opened by, and that a Go program's File outlives the caller's
// descriptor.
func TestOpenFile(t *testing.T) {
	fx := buildFixtures(t)
	fd, path := testutil.OpenReplaced(t, fx.pie)
	f, err := OpenFile(fd)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sites, err := f.Resolve("func_*")
	if err != nil || len(sites) != 3 {
		t.Fatalf("Resolve(func_*): %v, %v; want the fixture's 3 functions", sites, err)
	}
	if _, err := f.Resolve("no_such_func"); !errors.Is(err, ErrNoMatch) || !strings.HasPrefix(err.Error(), path+": ") {
		t.Errorf("no match: %v; want ErrNoMatch naming %s", err, path)
	}

	dir := filepath.Dir(path)
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := OpenFile(d); !errors.Is(err, ErrNotRegular) || !strings.Contains(err.Error(), dir) {
		t.Errorf("a directory: %v; want ErrNotRegular naming %s", err, dir)
	}

	goPath, err := testprogs.BuildGoTarget(runtime.GOARCH, false)
	if errors.Is(err, os.ErrNotExist) {
		testutil.RequireTool(t, "go", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	gofd, err := os.Open(goPath)
	if err != nil {
		t.Fatal(err)
	}
	g, err := OpenFile(gofd)
	gofd.Close() // the File reads Go code through a descriptor of its own
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	gs, err := g.Resolve(testprogs.GoTargetFuncs...)
	if err != nil {
		t.Fatal(err)
	}
	moved := 0
	for _, s := range gs {
		if s.Moved == MovedGoStackCheck {
			moved++
		}
	}
	if moved == 0 {
		t.Errorf("no Go entry moved past its stack check: %v", gs)
	}
}
