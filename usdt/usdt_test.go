package usdt

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/multiprobe/multiprobe/internal/glob"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/probetest"
	"golang.org/x/sys/unix"
)

// argCounts are the probes of the fixtures' probes.c and sema.c with their
// argument counts.
var argCounts = map[string]int{
	"consts": 8, "global": 1, "inlined": 1, "sema": 1, "sib": 2,
	"sizes": 8, "structp": 3, "twelve": 12,
}

const inlineSites = 300

func TestOpenTargets(t *testing.T) {
	tg := buildTargets(t)
	for _, path := range []string{tg.exe, tg.exeO0, tg.exeNoPIE} {
		t.Run(filepath.Base(path), func(t *testing.T) {
			f, err := Open(path)
			if err != nil {
				t.Fatal(err)
			}
			if want := nativeCase(t).arch; f.Arch != want {
				t.Fatalf("Arch = %s, want %s", f.Arch, want)
			}
			probes, err := f.Probes("mptest:*")
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, p := range probes {
				names = append(names, p.Name)
			}
			want := []string{"consts", "global", "inlined", "sema", "sib", "sizes", "structp", "twelve"}
			if !slices.Equal(names, want) {
				t.Fatalf("probes %v, want %v", names, want)
			}
			checkSites(t, path, probes)
			for _, p := range probes {
				if n := len(p.Sites); (p.Name == "inlined") != (n == inlineSites) || (p.Name != "inlined" && n != 1) {
					t.Errorf("%s: %d sites", &p, n)
				}
				for _, s := range p.Sites {
					if len(s.Args) != argCounts[p.Name] {
						t.Errorf("%s: %d args from %q, want %d", &p, len(s.Args), s.ArgString, argCounts[p.Name])
					}
				}
			}
			checkSemaphore(t, path, probes)
		})
	}
}

// checkSemaphore checks that only mptest:sema has a semaphore, that it is
// the provider_name_semaphore symbol, in a writable segment, and 0 in the
// file.
func checkSemaphore(t *testing.T, path string, probes []Probe) {
	t.Helper()
	ef, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	syms, err := ef.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	var semaSym uint64
	for _, s := range syms {
		if s.Name == "mptest_sema_semaphore" {
			semaSym = s.Value
		}
	}
	for _, p := range probes {
		if p.Name != "sema" {
			if p.Semaphore != 0 {
				t.Errorf("%s has semaphore %#x", &p, p.Semaphore)
			}
			continue
		}
		if p.Semaphore == 0 || p.Semaphore != semaSym {
			t.Fatalf("%s: semaphore %#x, symbol at %#x", &p, p.Semaphore, semaSym)
		}
		writable := false
		for _, prog := range ef.Progs {
			if prog.Type == elf.PT_LOAD && p.Semaphore >= prog.Vaddr && p.Semaphore < prog.Vaddr+prog.Memsz {
				writable = prog.Flags&elf.PF_W != 0 && prog.Flags&elf.PF_X == 0
				if got := p.Semaphore - prog.Vaddr + prog.Off; got != p.SemaphoreOffset {
					t.Errorf("semaphore offset %#x, want %#x", p.SemaphoreOffset, got)
				}
			}
		}
		if !writable {
			t.Errorf("%s: semaphore %#x not in a writable, non-executable segment", &p, p.Semaphore)
		}
	}
}

// TestArgForms checks that the -O2 build exercises the operand forms the
// tests are meant to cover, so that a compiler change cannot silently
// drop one.
func TestArgForms(t *testing.T) {
	tg := buildTargets(t)
	f, err := Open(tg.exe)
	if err != nil {
		t.Fatal(err)
	}
	checkForms(t, f.probes, formsOf(nativeCase(t)))
	if f.Arch != ArchX86_64 {
		return
	}
	// The global is named in the note ("global_counter(%rip)"): the
	// displacement must be its distance from the probe.
	g, err := f.Probes("mptest:global")
	if err != nil {
		t.Fatal(err)
	}
	ef, err := elf.Open(tg.exe)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	syms, _ := ef.Symbols()
	for _, s := range syms {
		if s.Name == "global_counter" {
			site := g[0].Sites[0]
			a := site.Args[0]
			if a.Reg != "rip" || a.Value != int64(s.Value)-int64(site.Address) {
				t.Errorf("global arg %+v, want rip%+d", a, int64(s.Value)-int64(site.Address))
			}
		}
	}
}

func TestLibrary(t *testing.T) {
	tg := buildTargets(t)
	f, err := Open(tg.lib)
	if err != nil {
		t.Fatal(err)
	}
	probes, err := f.Probes("*:*")
	if err != nil {
		t.Fatal(err)
	}
	if len(probes) != 1 || probes[0].String() != "mptestlib:libprobe" || len(probes[0].Sites[0].Args) != 2 {
		t.Fatalf("probes %+v", probes)
	}
	checkSites(t, tg.lib, probes)
}

func TestProbesPattern(t *testing.T) {
	tg := buildTargets(t)
	f, err := Open(tg.exe)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		pattern string
		want    int
		err     error
	}{
		{"", 8, nil},
		{"*", 8, nil},
		{"*:*", 8, nil},
		{"mptest:s*", 4, nil},
		{"inlined", 1, nil},
		{"mptest:sizes", 1, nil},
		{"mp*:*i*", 3, nil},
		{"other:*", 0, ErrNoProbes},
		{"mptest:[", 0, glob.ErrBadPattern},
	} {
		got, err := f.Probes(c.pattern)
		if !errors.Is(err, c.err) || len(got) != c.want {
			t.Errorf("Probes(%q) = %d probes, %v; want %d, %v", c.pattern, len(got), err, c.want, c.err)
		}
	}
	// A near miss names the probes it may have meant.
	for _, c := range []struct{ pattern, says string }{
		{"mptest:size", "did you mean mptest:sizes"},
		{"mptset:sizes", "did you mean mptest:sizes?"},
		{"inlnied", "did you mean mptest:inlined?"},
		{"zzzz:qqqq", "(8 probes in the file)"},
	} {
		if _, err := f.Probes(c.pattern); !errors.Is(err, ErrNoProbes) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("Probes(%q) = %v, want ErrNoProbes that says %q", c.pattern, err, c.says)
		}
	}
}

func TestNoNotes(t *testing.T) {
	exe, err := os.Executable() // a Go test binary has no stapsdt notes
	if err != nil {
		t.Fatal(err)
	}
	f, err := Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Probes("*"); !errors.Is(err, ErrNoProbes) {
		t.Fatalf("Probes: %v, want ErrNoProbes", err)
	}
	if _, err := Open("testdata/usdt_test.bpf.c"); !errors.Is(err, ErrNotELF) {
		t.Fatalf("Open of a C source file: %v, want ErrNotELF", err)
	}
}

// TestOpenFile checks that OpenFile reads the file its descriptor refers
// to, not what its path names by then, and names it by that path.
func TestOpenFile(t *testing.T) {
	tg := buildTargets(t)
	fd, path := testutil.OpenReplaced(t, tg.exe)
	f, err := OpenFile(fd)
	if err != nil {
		t.Fatal(err)
	}
	if f.Path != path {
		t.Errorf("Path = %q, want %q", f.Path, path)
	}
	if probes, err := f.Probes("mptest:sema"); err != nil || len(probes) != 1 {
		t.Errorf("Probes(mptest:sema) = %v, %v; want the target's one probe", probes, err)
	}
	if _, err := f.Probes("mptest:nothing"); !errors.Is(err, ErrNoProbes) || !strings.Contains(err.Error(), path) {
		t.Errorf("no match: %v; want ErrNoProbes naming %s", err, path)
	}
}

// TestPrelink simulates a prelinked binary: text moved by delta with the
// notes left behind. Shifting each note's location and base by -delta must
// give the same sites, through .stapsdt.base.
func TestPrelink(t *testing.T) {
	tg := buildTargets(t)
	data, err := os.ReadFile(tg.exe)
	if err != nil {
		t.Fatal(err)
	}
	ef, err := elf.Open(tg.exe)
	if err != nil {
		t.Fatal(err)
	}
	sec := ef.Section(".note.stapsdt")
	ef.Close()
	const delta = 0x1000
	notes, err := parseNotes(data[sec.Offset:sec.Offset+sec.Size], binary.LittleEndian, sec.Addralign)
	if err != nil {
		t.Fatal(err)
	}
	// Walk the notes again to patch them in place.
	off := sec.Offset
	for range notes {
		namesz := uint64(binary.LittleEndian.Uint32(data[off:]))
		descsz := uint64(binary.LittleEndian.Uint32(data[off+4:]))
		desc := off + 12 + (namesz+3)&^3
		for _, w := range []uint64{desc, desc + 8} {
			binary.LittleEndian.PutUint64(data[w:], binary.LittleEndian.Uint64(data[w:])-delta)
		}
		off = desc + (descsz+3)&^3
	}
	moved := filepath.Join(t.TempDir(), "prelinked")
	if err := os.WriteFile(moved, data, 0o755); err != nil {
		t.Fatal(err)
	}
	a, err := Open(tg.exe)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Open(moved)
	if err != nil {
		t.Fatal(err)
	}
	for i := range a.probes {
		if !slices.EqualFunc(a.probes[i].Sites, b.probes[i].Sites, func(x, y Site) bool {
			return x.Address == y.Address && x.Offset == y.Offset
		}) {
			t.Fatalf("%s: sites differ after prelink adjustment", &a.probes[i])
		}
	}
}

// TestSystemBinaries decodes the probes of binaries of the distribution,
// built by other people with other flags.
func TestSystemBinaries(t *testing.T) {
	paths, _ := filepath.Glob("/usr/bin/python3*")
	libs, _ := filepath.Glob("/usr/lib/*-linux-gnu/lib[cs]*.so.6") // libc, libstdc++
	paths = append(paths, libs...)
	tested := 0
	for _, path := range paths {
		f, err := Open(path)
		if err != nil {
			continue // a script, or not there
		}
		probes, err := f.Probes("*")
		if errors.Is(err, ErrNoProbes) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		tested++
		if f.Arch == ArchX86_64 {
			checkSites(t, path, probes)
		}
		t.Logf("%s: %d probes", path, len(probes))
	}
	if tested == 0 {
		probetest.Unavailable(t, "no system binary with USDT probes found (libstdc++ has some)")
	}
}

func TestMalformedNotes(t *testing.T) {
	le := binary.LittleEndian
	note := func(name string, typ uint32, desc []byte) []byte {
		b := le.AppendUint32(nil, uint32(len(name)+1))
		b = le.AppendUint32(b, uint32(len(desc)))
		b = le.AppendUint32(b, typ)
		b = append(b, name...)
		b = append(b, 0)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
		b = append(b, desc...)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
		return b
	}
	desc := func(strs string) []byte {
		b := le.AppendUint64(nil, 0x1000)
		b = le.AppendUint64(b, 0)
		b = le.AppendUint64(b, 0)
		return append(b, strs...)
	}
	good := note("stapsdt", 3, desc("p\x00n\x008@%rdi\x00"))
	for _, c := range []struct {
		name  string
		data  []byte
		notes int
		err   bool
	}{
		{"good", good, 1, false},
		{"two", append(slices.Clone(good), good...), 2, false},
		{"other name", note("GNU", 3, desc("x")), 0, false},
		{"other type", note("stapsdt", 1, desc("x")), 0, false},
		{"short header", good[:10], 0, true},
		{"desc past end", good[:len(good)-4], 0, true},
		{"short desc", note("stapsdt", 3, []byte{1, 2, 3}), 0, true},
		{"no NUL", note("stapsdt", 3, desc("p\x00n\x008@%rdi")), 0, true},
		{"empty name", note("stapsdt", 3, desc("p\x00\x00\x00")), 0, true},
		{"huge namesz", append(le.AppendUint32(le.AppendUint32(nil, 0xffffffff), 0), 3, 0, 0, 0), 0, true},
	} {
		notes, err := parseNotes(c.data, le, 4)
		if (err != nil) != c.err || len(notes) != c.notes {
			t.Errorf("%s: %d notes, %v", c.name, len(notes), err)
		}
		if err != nil && !errors.Is(err, ErrMalformedNote) {
			t.Errorf("%s: %v is not ErrMalformedNote", c.name, err)
		}
	}
}

// TestErrorsNamePath checks that every error about a file names it: a
// user probing many binaries must see which one failed.
func TestErrorsNamePath(t *testing.T) {
	tg := buildTargets(t)
	dir := t.TempDir()
	notELF := filepath.Join(dir, "not-elf")
	if err := os.WriteFile(notELF, []byte("#!/bin/sh\necho hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, path, pattern string
	}{
		{"missing", filepath.Join(dir, "missing"), "*"},
		{"directory", dir, "*"},
		{"fifo", fifo, "*"},
		{"not ELF", notELF, "*"},
		{"bad pattern", tg.exe, "mptest:["},
		{"no match", tg.exe, "mptest:nothing"},
		{"no notes", "/proc/self/exe", "*"},
	} {
		f, err := Open(c.path)
		if err == nil {
			_, err = f.Probes(c.pattern)
		}
		if err == nil {
			t.Errorf("%s: no error", c.name)
			continue
		}
		if !strings.Contains(err.Error(), c.path) {
			t.Errorf("%s: %q does not name %s", c.name, err, c.path)
		}
		if c.name == "not ELF" && !errors.Is(err, ErrNotELF) {
			t.Errorf("%s: %v, want ErrNotELF", c.name, err)
		}
	}
}
