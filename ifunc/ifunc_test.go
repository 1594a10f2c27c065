package ifunc_test

import (
	"bufio"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/multiprobe/multiprobe/elfsym"
	"github.com/multiprobe/multiprobe/ifunc"
	"github.com/multiprobe/multiprobe/internal/fds"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/probetest"
)

// TestResolveLibc resolves three of glibc's IFUNCs and checks each against
// the implementation the loader chose in a running program: the address
// its GOT holds, less where libc is mapped there.
func TestResolveLibc(t *testing.T) {
	probetest.RequireRoot(t) // ptrace of a child needs no root, but Yama may say otherwise
	target := testprogs.IFuncTarget(t)
	libc, err := elfsym.LookPath("libc.so.6")
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"strlen", "strchr", "memcpy"}
	sites, err := elfsym.Resolve(libc, names...)
	if err != nil {
		t.Fatal(err)
	}
	// Which are IFUNCs depends on the architecture (arm64's strchr is
	// not); a plain function's address is its own.
	resolvers := map[string]uint64{}
	ifuncs := 0
	for _, s := range sites {
		if s.Type == elf.STT_GNU_IFUNC {
			ifuncs++
		}
		for _, n := range append([]string{s.Name}, s.Aliases...) {
			base, _, _ := strings.Cut(n, "@")
			resolvers[base] = s.Address
			if s.Type != elf.STT_GNU_IFUNC {
				resolvers[base] |= 1 << 63 // not to resolve
			}
		}
	}
	if ifuncs < 2 {
		t.Fatalf("%d of %v are IFUNCs in %s", ifuncs, names, libc)
	}
	var in []uint64
	var which []int
	for i, n := range names {
		if resolvers[n]&(1<<63) == 0 {
			in = append(in, resolvers[n])
			which = append(which, i)
		}
	}
	impls, err := ifunc.Resolve(libc, in)
	if err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(target, "-wait", "0")
	line := startTarget(t, cmd)
	base := libcBase(t, cmd.Process.Pid, libc)
	addrs := strings.Fields(line)
	for j, i := range which {
		addr, err := strconv.ParseUint(strings.TrimPrefix(addrs[i], "0x"), 16, 64)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := impls[j], addr-base; got != want {
			t.Errorf("%s: resolver %#x resolved to %#x; the loader chose %#x", names[i], in[j], got, want)
		} else {
			t.Logf("%s: resolver %#x -> implementation %#x", names[i], in[j], got)
		}
	}
}

// startTarget starts cmd, the IFUNC target with -wait, and returns the
// line it prints once its loader has relocated libc: the addresses it
// resolved strlen, strchr, memcpy and strstr to. The target finishes when
// the test ends.
func startTarget(t *testing.T, cmd *exec.Cmd) string {
	t.Helper()
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	return line
}

// libcBase returns where libc's first segment is mapped in process pid.
func libcBase(t *testing.T, pid int, libc string) uint64 {
	t.Helper()
	real, err := os.Readlink(libc)
	if err != nil {
		real = libc
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) >= 6 && f[2] == "00000000" && strings.HasSuffix(f[5], "/"+baseName(real)) {
			start, _, _ := strings.Cut(f[0], "-")
			v, _ := strconv.ParseUint(start, 16, 64)
			return v
		}
	}
	t.Fatalf("libc not in the maps of %d", pid)
	return 0
}

func baseName(p string) string { return p[strings.LastIndexByte(p, '/')+1:] }

func TestResolveRefusesExecutable(t *testing.T) {
	if _, err := ifunc.Resolve("/bin/true", []uint64{0x1000}); err == nil {
		t.Fatal("resolving an executable's IFUNCs succeeded")
	}
}

// TestSitesVDSO: glibc's time and gettimeofday on x86-64 are IFUNCs whose
// resolvers pick the vDSO's code, which no uprobe reaches. Sites keeps
// each resolver and says, for that site alone and on one line, where its
// implementation is.
func TestSitesVDSO(t *testing.T) {
	probetest.RequireRoot(t)
	libc, err := elfsym.LookPath("libc.so.6")
	if err != nil {
		t.Fatal(err)
	}
	sites, err := elfsym.Resolve(libc, "time", "gettimeofday", "strlen")
	if err != nil {
		t.Fatal(err)
	}
	moved := sitesIn(t, libc, sites)
	vdso := 0
	for i, s := range sites {
		m := moved[i]
		t.Logf("%s: %s (%s)", s.Name, m.Moved, m.Note)
		if strings.Contains(m.Note, "\n") {
			t.Errorf("%s: Note runs over lines: %q", s.Name, m.Note)
		}
		if m.Moved != elfsym.KeptIFuncResolver {
			continue
		}
		if m.Offset != s.Offset {
			t.Errorf("%s: resolver kept, yet offset %#x, not the resolver's %#x", s.Name, m.Offset, s.Offset)
		}
		// Each says which resolver it is about, and no other.
		if !strings.Contains(m.Note, fmt.Sprintf("resolver at %#x", s.Address)) || strings.Count(m.Note, "resolver at") != 1 {
			t.Errorf("%s: %q, want its own resolver (%#x) named, once", s.Name, m.Note, s.Address)
		}
		if strings.Contains(m.Note, "[vdso]") {
			vdso++
		}
	}
	if runtime.GOARCH == "amd64" && vdso != 2 {
		t.Errorf("%d sites say their implementation is in [vdso], want time and gettimeofday's", vdso)
	}
}

// sitesIn is ifunc.Sites for the library at path, opened as multiprobe
// opens one (confined to a process's root for a /proc/PID/root path).
func sitesIn(t *testing.T, path string, sites []elfsym.Site) []elfsym.Site {
	t.Helper()
	f, err := fds.OpenRegular(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return ifunc.Sites(f, sites)
}

// TestSitesReadTheOpenFile resolves libc's strlen in a copy, then puts
// another file at the copy's path: Sites still finds the implementation
// in the file it was given, the one the sites came from, not in what the
// path names now (a program, which has no IFUNCs to run).
func TestSitesReadTheOpenFile(t *testing.T) {
	probetest.RequireRoot(t) // the helper runs as the file's owner
	libc, err := elfsym.LookPath("libc.so.6")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "libc.so.6")
	copyTo(t, libc, path)
	f, err := fds.OpenRegular(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ef, err := elfsym.OpenFile(f)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	sites, err := ef.Resolve("strlen")
	if err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, "other")
	copyTo(t, "/bin/true", other)
	if err := os.Rename(other, path); err != nil {
		t.Fatal(err)
	}
	moved := ifunc.Sites(f, sites)
	if moved[0].Moved != elfsym.MovedIFunc || moved[0].Offset == sites[0].Offset {
		t.Errorf("strlen: offset %#x (resolver %#x): %s (%s)", moved[0].Offset, sites[0].Offset, moved[0].Moved, moved[0].Note)
	}
}

func copyTo(t *testing.T, src, dst string) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, data, 0o755); err != nil {
		t.Fatal(err)
	}
}
