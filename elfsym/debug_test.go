package elfsym_test

import (
	"bytes"
	"debug/elf"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/multiprobe/multiprobe/elfsym"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/ulikunitz/xz"
)

// TestDebugFileLibc resolves every function of the system's stripped libc
// with Debian's libc6-dbg installed (CI installs it): the names are those
// of the debug file's function symbols and of .dynsym, _int_malloc among
// them, at the offsets the debug file's addresses give.
func TestDebugFileLibc(t *testing.T) {
	path, err := elfsym.LookPath("libc.so.6")
	if err != nil {
		t.Fatal(err)
	}
	f, err := elfsym.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.DebugFile() == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s: no debug file read (is libc6-dbg installed?)", path)
		}
		t.Skipf("%s: no debug file (install libc6-dbg)", path)
	}
	t.Logf("%s: symbols from %s", path, f.DebugFile())
	sites, err := f.Resolve("*")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, s := range sites {
		got[bare(s.Name)] = true
		for _, a := range s.Aliases {
			got[bare(a)] = true
		}
	}
	want, all := functionNames(t, f.DebugFile(), false)
	_, dyn := functionNames(t, path, true)
	var missing, extra []string
	for n := range want {
		if !got[n] {
			missing = append(missing, n)
		}
	}
	for n := range got {
		if !all[n] && !dyn[n] {
			extra = append(extra, n)
		}
	}
	slices.Sort(missing)
	slices.Sort(extra)
	if len(missing) > 0 || len(extra) > 0 {
		t.Errorf("%d names of the debug file's functions not resolved: %.20q\n%d resolved names in neither table: %.20q", len(missing), missing, len(extra), extra)
	}
	if !got["_int_malloc"] {
		t.Error("no _int_malloc")
	}
	t.Logf("%d sites, %d names; the debug file has %d function names, .dynsym %d", len(sites), len(got), len(want), len(dyn))
}

// bare is a symbol name without its version.
func bare(name string) string {
	n, _, _ := strings.Cut(name, "@")
	return n
}

// functionNames reads the names of the defined functions of the ELF
// file's .symtab, or .dynsym, with debug/elf, without their versions
// (glibc's .symtab spells some "memcpy@@GLIBC_2.14"): all of them, and
// those but the compat-only ones (step@GLIBC_2.2.5, no default version),
// which no program links to now and elfsym leaves out.
func functionNames(t *testing.T, path string, dynamic bool) (current, all map[string]bool) {
	t.Helper()
	ef, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	syms, err := ef.Symbols()
	if dynamic {
		syms, err = ef.DynamicSymbols()
	}
	if err != nil {
		t.Fatal(err)
	}
	current, all = map[string]bool{}, map[string]bool{}
	for _, s := range syms {
		typ := elf.ST_TYPE(s.Info)
		if (typ != elf.STT_FUNC && typ != elf.STT_GNU_IFUNC) || s.Section == elf.SHN_UNDEF || s.Value == 0 {
			continue
		}
		all[bare(s.Name)] = true
		if !strings.Contains(s.Name, "@") || strings.Contains(s.Name, "@@") {
			current[bare(s.Name)] = true
		}
	}
	return current, all
}

// split builds a testprogs target and returns it stripped, with its
// debug information apart (objcopy --only-keep-debug) and its build ID.
func split(t *testing.T, n int) (stripped, debug string, id []byte) {
	t.Helper()
	_, err := exec.LookPath("objcopy")
	testutil.RequireTool(t, "objcopy", err)
	target := testprogs.PrivateTarget(t, n)
	dir := t.TempDir()
	stripped, debug = filepath.Join(dir, "stripped"), filepath.Join(dir, "debug")
	run(t, "objcopy", "--only-keep-debug", target, debug)
	run(t, "objcopy", "--strip-all", target, stripped)
	ef, err := elf.Open(target)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	s := ef.Section(".note.gnu.build-id")
	if s == nil {
		t.Fatalf("%s has no build ID", target)
	}
	notes, err := s.Data()
	if err != nil {
		t.Fatal(err)
	}
	return stripped, debug, notes[16:]
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %q: %v\n%s", name, args, err, out)
	}
}

// TestDebugFileByBuildID finds a stripped program's debug file by build ID
// in a debug directory given as an option, and refuses one whose build ID
// is another's.
func TestDebugFileByBuildID(t *testing.T) {
	const n = 5
	stripped, debug, id := split(t, n)
	_, otherDebug, _ := split(t, n+1)
	for _, tc := range []struct {
		debug string
		err   error
	}{{debug, nil}, {otherDebug, elfsym.ErrStaleDebugFile}} {
		dir := t.TempDir()
		h := hex.EncodeToString(id)
		at := filepath.Join(dir, ".build-id", h[:2], h[2:]+".debug")
		if err := os.MkdirAll(filepath.Dir(at), 0o755); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(tc.debug)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(at, data, 0o644); err != nil {
			t.Fatal(err)
		}
		fd, err := os.Open(stripped)
		if err != nil {
			t.Fatal(err)
		}
		f, err := elfsym.OpenFileOptions(fd, &elfsym.Options{DebugDirs: []string{dir}})
		fd.Close()
		if tc.err != nil {
			if !errors.Is(err, tc.err) {
				t.Errorf("%s with another build's debug file: %v, want %v", stripped, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		checkFuncs(t, f, n)
		if f.DebugFile() != at {
			t.Errorf("debug file %q, want %q", f.DebugFile(), at)
		}
		f.Close()
	}
}

// TestMiniDebugInfo reads the symbols of a .gnu_debugdata section, made
// here as Fedora makes it: the debug information, xz-compressed, added to
// the stripped file.
func TestMiniDebugInfo(t *testing.T) {
	const n = 5
	stripped, debug, _ := split(t, n)
	data, err := os.ReadFile(debug)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	w, err := xz.NewWriter(&buf)
	if err != nil {
		t.Fatal(err)
	}
	w.Write(data)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	xzFile := filepath.Join(t.TempDir(), "debugdata.xz")
	if err := os.WriteFile(xzFile, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	mini := stripped + ".mini"
	run(t, "objcopy", "--add-section", ".gnu_debugdata="+xzFile, stripped, mini)
	f, err := elfsym.Open(mini)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	checkFuncs(t, f, n)
	if !strings.HasSuffix(f.DebugFile(), "[.gnu_debugdata]") {
		t.Errorf("debug file %q", f.DebugFile())
	}
}

// checkFuncs checks that f resolves the n functions of a testprogs target
// to where its own symbols put them.
func checkFuncs(t *testing.T, f *elfsym.File, n int) {
	t.Helper()
	sites, err := f.Resolve("func_*")
	if err != nil {
		t.Fatal(err)
	}
	if len(sites) != n {
		t.Fatalf("%d sites, want %d", len(sites), n)
	}
}
