package elfsym

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/probetest"
)

// fixtures are the C and Go programs the tests resolve symbols in, built once
// per test binary run.
type fixtures struct {
	pie, nopie, shifted, lib, gostripped string
}

var (
	fixOnce sync.Once
	fix     fixtures
	fixErr  error
	fixDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if fixDir != "" {
		os.RemoveAll(fixDir)
	}
	os.Exit(code)
}

func run(dir string, name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// buildFixtures compiles testdata with gcc and go.
func buildFixtures(t testing.TB) fixtures {
	t.Helper()
	fixOnce.Do(func() {
		gcc, err := exec.LookPath("gcc")
		if err != nil {
			fixErr = err
			return
		}
		fixDir, fixErr = os.MkdirTemp("", "elfsym-fixtures")
		if fixErr != nil {
			return
		}
		td, _ := filepath.Abs("testdata")
		src := []string{filepath.Join(td, "fixture.c"), filepath.Join(td, "dup_a.c"), filepath.Join(td, "dup_b.c")}
		fix = fixtures{
			pie:        filepath.Join(fixDir, "fixture-pie"),
			nopie:      filepath.Join(fixDir, "fixture-nopie"),
			shifted:    filepath.Join(fixDir, "fixture-shifted"),
			lib:        filepath.Join(fixDir, "libversioned.so"),
			gostripped: filepath.Join(fixDir, "gostripped"),
		}
		steps := [][]string{
			append([]string{gcc, "-O1", "-fPIE", "-pie", "-o", fix.pie}, src...),
			append([]string{gcc, "-O1", "-fno-pie", "-no-pie", "-o", fix.nopie}, src...),
			// Moving the text segment makes p_vaddr - p_offset differ from
			// the other segments', so an offset computed from the wrong
			// header shows.
			append([]string{gcc, "-O1", "-fPIE", "-pie", "-Wl,-z,separate-code", "-Wl,-Ttext-segment=0x23000", "-o", fix.shifted}, src...),
			{gcc, "-O1", "-fPIC", "-shared", "-Wl,--version-script=" + filepath.Join(td, "versioned.map"),
				"-o", fix.lib, filepath.Join(td, "versioned.c")},
		}
		for _, s := range steps {
			if fixErr = run(fixDir, s[0], s[1:]...); fixErr != nil {
				return
			}
		}
		gobin := filepath.Join(os.Getenv("GOROOT"), "bin", "go")
		if _, err := os.Stat(gobin); err != nil {
			gobin = "go"
		}
		cmd := exec.Command(gobin, "build", "-ldflags=-s", "-o", fix.gostripped, ".")
		cmd.Dir = filepath.Join(td, "gostripped")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=mod", "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			fixErr = fmt.Errorf("go build gostripped: %w\n%s", err, out)
		}
	})
	testutil.RequireTool(t, "gcc and go (building test fixtures)", fixErr)
	return fix
}

// checkOffsets verifies every site's offset independently of the program
// headers: through the section that holds the address (what readelf shows),
// and by comparing the bytes there with the bytes at the offset.
func checkOffsets(t *testing.T, path string, sites []Site) {
	t.Helper()
	ef, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sites {
		var sec *elf.Section
		for _, c := range ef.Sections {
			if c.Flags&elf.SHF_ALLOC != 0 && c.Type == elf.SHT_PROGBITS && s.Address >= c.Addr && s.Address < c.Addr+c.Size {
				sec = c
				break
			}
		}
		if sec == nil {
			t.Errorf("%s: site %v: address %#x is in no section", path, s, s.Address)
			continue
		}
		want := s.Address - sec.Addr + sec.Offset
		if s.SymbolOffset != want {
			t.Errorf("%s: site %s: symbol offset %#x, section %s says %#x", path, s.Name, s.SymbolOffset, sec.Name, want)
		}
		if moved := s.Offset - s.SymbolOffset; (s.Moved == NotMoved) != (moved == 0) || moved > goEntryWindow {
			t.Errorf("%s: site %s: offset %#x, symbol at %#x, moved %v", path, s.Name, s.Offset, s.SymbolOffset, s.Moved)
		}
		if s.Offset >= uint64(len(raw)) {
			t.Errorf("%s: site %s: offset %#x past the end of the file", path, s.Name, s.Offset)
		}
	}
}

// mappedBytes starts path with "wait", and returns a function that reads n
// bytes at a link-time virtual address from the running process's memory.
func mappedBytes(t *testing.T, path string) func(vaddr uint64, n int) []byte {
	t.Helper()
	cmd := exec.Command(path, "wait")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("%s wait: %q, %v", path, line, err)
	}
	pid := cmd.Process.Pid
	ef, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	// The load bias: where the first PT_LOAD (file offset 0) was mapped,
	// less its link-time address.
	var firstVaddr uint64
	for _, p := range ef.Progs {
		if p.Type == elf.PT_LOAD {
			firstVaddr = p.Vaddr &^ (p.Align - 1)
			break
		}
	}
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	real, _ := filepath.EvalSymlinks(path)
	var base uint64
	for _, line := range strings.Split(string(maps), "\n") {
		f := strings.Fields(line)
		if len(f) >= 6 && f[5] == real && f[2] == "00000000" {
			start, _, _ := strings.Cut(f[0], "-")
			base, _ = strconv.ParseUint(start, 16, 64)
			break
		}
	}
	if base == 0 {
		t.Fatalf("%s is not mapped in process %d:\n%s", real, pid, maps)
	}
	bias := base - firstVaddr
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		probetest.Unavailable(t, "reading process memory: %v", err)
	}
	t.Cleanup(func() { mem.Close() })
	return func(vaddr uint64, n int) []byte {
		buf := make([]byte, n)
		if _, err := mem.ReadAt(buf, int64(bias+vaddr)); err != nil {
			t.Fatalf("reading %#x in process %d: %v", bias+vaddr, pid, err)
		}
		return buf
	}
}

func siteNames(sites []Site) []string {
	var names []string
	for _, s := range sites {
		names = append(names, s.Name)
	}
	return names
}

func findSite(sites []Site, name string) (Site, bool) {
	for _, s := range sites {
		if s.Name == name {
			return s, true
		}
	}
	return Site{}, false
}

func fileBytes(t *testing.T, path string, off uint64, n int) []byte {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if off+uint64(n) > uint64(len(raw)) {
		t.Fatalf("offset %#x+%d past the end of %s", off, n, path)
	}
	return bytes.Clone(raw[off : off+uint64(n)])
}
