package elfsym

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/internal/testutil"
)

func TestResolvePatterns(t *testing.T) {
	fx := buildFixtures(t)
	tests := []struct {
		name     string
		patterns []string
		want     []string // primary names, sorted
	}{
		{"glob", []string{"func_*"}, []string{"func_alpha", "func_beta", "func_gamma"}},
		{"question", []string{"sh_?et*"}, []string{"sh_get_var", "sh_set_var"}},
		{"class", []string{"func_[ab]*"}, []string{"func_alpha", "func_beta"}},
		{"range", []string{"func_[a-b]*"}, []string{"func_alpha", "func_beta"}},
		{"negated class", []string{"func_[!a]*"}, []string{"func_beta", "func_gamma"}},
		{"several", []string{"func_alpha", "sh_get*"}, []string{"func_alpha", "sh_get_var"}},
		{"exclusion after", []string{"func_*", "!func_beta"}, []string{"func_alpha", "func_gamma"}},
		{"exclusion before", []string{"!*beta", "func_*"}, []string{"func_alpha", "func_gamma"}},
		// A site is named by what the pattern matched (real_func is its
		// alias then), as bpftrace names a probe by its spec.
		{"alias folds, named as matched", []string{"alias_func"}, []string{"alias_func"}},
		{"alias glob folds", []string{"alias_*", "real_*"}, []string{"real_func"}},
		{"all aliases one site", []string{"real_func", "alias_func", "weak_alias"}, []string{"real_func"}},
		{"local", []string{"local_func"}, []string{"local_func"}},
		{"weak", []string{"weak_only"}, []string{"weak_only"}},
		{"ifunc", []string{"picked"}, []string{"picked"}},
		{"strong beats weak", []string{"wdup"}, []string{"wdup"}},
		{"glob keeps both locals", []string{"dup"}, nil}, // ambiguous: checked below
	}
	for _, bin := range []string{fx.pie, fx.nopie, fx.shifted} {
		f, err := Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for _, tt := range tests {
			if tt.want == nil {
				continue
			}
			t.Run(filepath.Base(bin)+"/"+tt.name, func(t *testing.T) {
				sites, err := f.Resolve(tt.patterns...)
				if err != nil {
					t.Fatal(err)
				}
				got := siteNames(sites)
				slices.Sort(got)
				if !slices.Equal(got, tt.want) {
					t.Errorf("Resolve(%q) = %q, want %q", tt.patterns, got, tt.want)
				}
				checkOffsets(t, bin, sites)
			})
		}
	}
}

func TestResolveSiteFields(t *testing.T) {
	fx := buildFixtures(t)
	sites, err := Resolve(fx.pie, "*")
	if err != nil {
		t.Fatal(err)
	}
	checkOffsets(t, fx.pie, sites)

	real, ok := findSite(sites, "real_func")
	if !ok {
		t.Fatalf("real_func missing from %q", siteNames(sites))
	}
	if !slices.Equal(real.Aliases, []string{"alias_func", "weak_alias"}) {
		t.Errorf("real_func aliases = %q", real.Aliases)
	}
	if real.Bind != elf.STB_GLOBAL || real.Type != elf.STT_FUNC || real.Size == 0 {
		t.Errorf("real_func = %+v", real)
	}
	if s, _ := findSite(sites, "picked"); s.Type != elf.STT_GNU_IFUNC {
		t.Errorf("picked type = %v, want STT_GNU_IFUNC", s.Type)
	}
	if s, _ := findSite(sites, "weak_only"); s.Bind != elf.STB_WEAK {
		t.Errorf("weak_only bind = %v", s.Bind)
	}
	if s, _ := findSite(sites, "local_func"); s.Bind != elf.STB_LOCAL {
		t.Errorf("local_func bind = %v", s.Bind)
	}
	// No two sites share an offset: the kernel would fire each.
	seen := map[uint64]string{}
	for _, s := range sites {
		if prev, dup := seen[s.Offset]; dup {
			t.Errorf("%s and %s share offset %#x", prev, s.Name, s.Offset)
		}
		seen[s.Offset] = s.Name
		if s.Offset == 0 || s.Address == 0 {
			t.Errorf("site %+v at zero", s)
		}
	}
	// Undefined imports (printf, strcmp, pause) are not sites.
	for _, imp := range []string{"printf", "strcmp", "pause", "fflush"} {
		if _, ok := findSite(sites, imp); ok {
			t.Errorf("undefined import %s reported as a site", imp)
		}
	}
	if !slices.IsSortedFunc(sites, func(a, b Site) int { return int(a.Offset) - int(b.Offset) }) {
		t.Error("sites are not sorted by offset")
	}
}

// TestResolveMapped checks offsets against the running program: the bytes at
// each site's file offset are the bytes the loader mapped at its address.
func TestResolveMapped(t *testing.T) {
	fx := buildFixtures(t)
	for _, bin := range []string{fx.pie, fx.nopie, fx.shifted} {
		t.Run(filepath.Base(bin), func(t *testing.T) {
			sites, err := Resolve(bin, "*")
			if err != nil {
				t.Fatal(err)
			}
			read := mappedBytes(t, bin)
			for _, s := range sites {
				n := int(min(max(s.Size, 1), 16))
				got, want := read(s.Address, n), fileBytes(t, bin, s.Offset, n)
				if !bytes.Equal(got, want) {
					t.Errorf("%s: %s: mapped bytes % x, file bytes at %#x % x", bin, s.Name, got, s.Offset, want)
				}
			}
		})
	}
}

func TestShiftedSegment(t *testing.T) {
	fx := buildFixtures(t)
	ef, err := elf.Open(fx.shifted)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	var deltas []uint64
	for _, p := range ef.Progs {
		if p.Type == elf.PT_LOAD && p.Flags&elf.PF_X != 0 {
			deltas = append(deltas, p.Vaddr-p.Off)
		}
	}
	if len(deltas) == 0 || deltas[0] == 0 {
		t.Fatalf("fixture's text segment has p_vaddr - p_offset = %#x, want non-zero", deltas)
	}
}

func TestAmbiguous(t *testing.T) {
	fx := buildFixtures(t)
	_, err := Resolve(fx.pie, "dup")
	var ae *AmbiguousError
	if !errors.As(err, &ae) || !errors.Is(err, ErrAmbiguous) {
		t.Fatalf("Resolve(dup) = %v, want an AmbiguousError", err)
	}
	if len(ae.Sites) != 2 || ae.Sites[0].Offset == ae.Sites[1].Offset {
		t.Errorf("ambiguous sites = %+v", ae.Sites)
	}
	if !strings.Contains(err.Error(), "dup") || !strings.Contains(err.Error(), "offset") {
		t.Errorf("error does not list the definitions: %v", err)
	}
	// A glob selects both.
	sites, err := Resolve(fx.pie, "du[p]")
	if err != nil || len(sites) != 2 {
		t.Errorf("Resolve(du[p]) = %v, %v; want two sites", sites, err)
	}
}

func TestVersioned(t *testing.T) {
	fx := buildFixtures(t)
	f, err := Open(fx.lib)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	def, err := f.Resolve("vfunc")
	if err != nil {
		t.Fatal(err)
	}
	v2, err := f.Resolve("vfunc_v2")
	if err != nil {
		t.Fatal(err)
	}
	if len(def) != 1 || def[0].Offset != v2[0].Offset || def[0].Version != "VERS_2" || def[0].Name != "vfunc" {
		t.Errorf("vfunc = %+v, want the default version VERS_2 at vfunc_v2 (%#x)", def, v2[0].Offset)
	}
	old, err := f.Resolve("vfunc@VERS_1")
	if err != nil {
		t.Fatal(err)
	}
	v1, err := f.Resolve("vfunc_v1")
	if err != nil {
		t.Fatal(err)
	}
	if len(old) != 1 || old[0].Offset != v1[0].Offset || old[0].Offset == def[0].Offset ||
		old[0].Name != "vfunc@VERS_1" || old[0].Version != "VERS_1" {
		t.Errorf("vfunc@VERS_1 = %+v, want vfunc@VERS_1 (version VERS_1) at vfunc_v1's %#x", old, v1[0].Offset)
	}
	if both, err := f.Resolve("vfunc@VERS_*"); err != nil || len(both) != 2 {
		t.Errorf("vfunc@VERS_* = %+v, %v; want both versions", both, err)
	}
	if _, err := f.Resolve("vfunc@@VERS_1"); !errors.Is(err, ErrNoMatch) {
		t.Errorf("vfunc@@VERS_1 = %v, want no match (VERS_1 is not the default)", err)
	}
	// A function with only a compat version is selected without '@', as
	// "name@VERSION": old binaries call it. One with a default version is
	// not selected at its other versions that way (vfunc above).
	for _, pat := range []string{"ofunc", "ofu*", "ofunc@VERS_1", "ofunc@*"} {
		o, err := f.Resolve(pat)
		if err != nil || len(o) != 1 || o[0].Name != "ofunc@VERS_1" || o[0].Version != "VERS_1" {
			t.Errorf("%s = %+v, %v; want ofunc@VERS_1, which has no default version", pat, o, err)
		}
	}
	if o, err := f.Resolve("ofunc@@*"); !errors.Is(err, ErrNoMatch) {
		t.Errorf("ofunc@@* = %+v, %v; want no match (ofunc has no default version)", o, err)
	}
	if o, err := f.Resolve("*func", "!ofunc"); err != nil || slices.ContainsFunc(o, func(s Site) bool { return strings.HasPrefix(s.Name, "ofunc") }) {
		t.Errorf("*func !ofunc = %+v, %v; want no ofunc", o, err)
	}
	lib, err := f.Resolve("lib_*")
	if err != nil || len(lib) != 1 || lib[0].Name != "lib_func" || !slices.Contains(lib[0].Aliases, "lib_alias") {
		t.Errorf("lib_* = %+v, %v; want lib_func with alias lib_alias", lib, err)
	}
	all, err := f.Resolve("*")
	if err != nil {
		t.Fatal(err)
	}
	checkOffsets(t, fx.lib, all)
	checkNames(t, all)
}

// checkNames checks that names, versions and aliases are clean strings and
// that a name spelled "name@VERSION" carries VERSION.
func checkNames(t *testing.T, sites []Site) {
	t.Helper()
	for _, s := range sites {
		for _, n := range append([]string{s.Name, s.Version}, s.Aliases...) {
			if strings.ContainsAny(n, "\x00") {
				t.Errorf("site %q: name, version or alias %q has a NUL", s.Name, n)
			}
		}
		if base, ver, ok := strings.Cut(s.Name, "@"); ok && (ver != s.Version || base == "") {
			t.Errorf("site %q has version %q", s.Name, s.Version)
		}
	}
}

func TestGoStripped(t *testing.T) {
	fx := buildFixtures(t)
	ef, err := elf.Open(fx.gostripped)
	if err != nil {
		t.Fatal(err)
	}
	if ef.Section(".symtab") != nil {
		t.Fatal("fixture is not stripped")
	}
	ef.Close()
	sites, err := Resolve(fx.gostripped, "main.*")
	if err != nil {
		t.Fatal(err)
	}
	names := siteNames(sites)
	for _, want := range []string{"main.main", "main.hello", "main.(*counter).Add"} {
		if !slices.Contains(names, want) {
			t.Errorf("main.* = %q, missing %s", names, want)
		}
	}
	checkOffsets(t, fx.gostripped, sites)
	if _, err := Resolve(fx.gostripped, "runtime.mallocgc"); err != nil {
		t.Error(err)
	}
}

func TestSystemFiles(t *testing.T) {
	bash, err := LookPath("bash")
	testutil.RequireTool(t, "bash", err)
	sites, err := Resolve(bash, "*")
	if err != nil {
		t.Fatal(err)
	}
	if len(sites) < 100 {
		t.Errorf("bash: only %d sites", len(sites))
	}
	checkOffsets(t, bash, sites)
	checkNames(t, sites)

	libc, err := LookPath("libc.so.6")
	if err != nil {
		t.Fatal(err)
	}
	f, err := Open(libc)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	all, err := f.Resolve("*")
	if err != nil {
		t.Fatal(err)
	}
	checkOffsets(t, libc, all)
	checkNames(t, all)
	if f.Machine() == elf.EM_X86_64 {
		cur, err := f.Resolve("memcpy")
		if err != nil {
			t.Fatal(err)
		}
		old, err := f.Resolve("memcpy@GLIBC_2.2.5")
		if err != nil {
			t.Fatal(err)
		}
		if cur[0].Version != "GLIBC_2.14" || cur[0].Offset == old[0].Offset ||
			old[0].Name != "memcpy@GLIBC_2.2.5" || old[0].Version != "GLIBC_2.2.5" {
			t.Errorf("memcpy = %+v, memcpy@GLIBC_2.2.5 = %+v: want the default GLIBC_2.14 at another offset", cur, old)
		}
		strlen, err := f.Resolve("strlen")
		if err != nil || strlen[0].Type != elf.STT_GNU_IFUNC {
			t.Errorf("strlen = %+v, %v; want an IFUNC", strlen, err)
		}
	}
	malloc, err := f.Resolve("malloc")
	if err != nil || len(malloc) != 1 {
		t.Fatalf("malloc = %+v, %v", malloc, err)
	}
}

func TestErrors(t *testing.T) {
	fx := buildFixtures(t)
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good, err := os.ReadFile(fx.pie)
	if err != nil {
		t.Fatal(err)
	}
	be := bytes.Clone(good)
	be[elf.EI_DATA] = byte(elf.ELFDATA2MSB)
	c32 := bytes.Clone(good)
	c32[elf.EI_CLASS] = byte(elf.ELFCLASS32)

	tests := []struct {
		name string
		path string
		want error
	}{
		{"missing", filepath.Join(dir, "nope"), ErrNotFound},
		{"missing is fs.ErrNotExist", filepath.Join(dir, "nope"), fs.ErrNotExist},
		{"not elf", write("text", []byte("#!/bin/sh\necho hello, this is not an ELF file at all\n")), ErrNotELF},
		{"empty", write("empty", nil), ErrNotELF},
		{"directory", dir, ErrNotRegular},
		{"fifo", fifo, ErrNotRegular}, // must not block
		{"device", "/dev/zero", ErrNotRegular},
		{"big-endian", write("be", be), ErrUnsupported},
		{"32-bit", write("c32", c32), ErrUnsupported},
		{"truncated", write("trunc", good[:len(good)/2]), ErrMalformed},
		{"header only", write("hdr", good[:64]), ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := Open(tt.path)
			if err == nil {
				f.Close()
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("Open(%s) = %v, want %v", tt.name, err, tt.want)
			}
			if !strings.Contains(err.Error(), tt.path) {
				t.Errorf("error %q does not name the file", err)
			}
		})
	}

	_, err = Resolve(fx.pie, "func_alpah")
	var nm *NoMatchError
	if !errors.As(err, &nm) || !errors.Is(err, ErrNoMatch) {
		t.Fatalf("no match: %v", err)
	}
	if nm.Searched == 0 || !slices.Contains(nm.Suggestions, "func_alpha") || !strings.Contains(err.Error(), fx.pie) {
		t.Errorf("no-match error = %v (%+v), want it to name the file, count and suggest func_alpha", err, nm)
	}
	// An exact name that names nothing fails even when the other
	// patterns select sites, and the error names only it.
	for _, pats := range [][]string{{"func_alpha", "func_alpah"}, {"func_*", "func_alpah"}, {"func_alpah", "func_*"}} {
		_, err = Resolve(fx.pie, pats...)
		if !errors.As(err, &nm) || len(nm.Patterns) != 1 || nm.Patterns[0] != "func_alpah" || !slices.Contains(nm.Suggestions, "func_alpha") {
			t.Errorf("Resolve(%q) = %v, want a no-match error for func_alpah alone, suggesting func_alpha", pats, err)
		}
	}
	// An exact name that a glob before it selected is found.
	if sites, err := Resolve(fx.pie, "func_*", "func_alpha"); err != nil || len(sites) != 3 {
		t.Errorf("Resolve(func_*, func_alpha) = %d sites, %v; want 3", len(sites), err)
	}
	for _, bad := range [][]string{{"func_["}, {"!func_*"}, {}, {""}, {"f@"}} {
		if _, err := Resolve(fx.pie, bad...); !errors.Is(err, ErrBadPattern) {
			t.Errorf("Resolve(%q) = %v, want ErrBadPattern", bad, err)
		}
	}
}

func TestLookPath(t *testing.T) {
	libc, err := LookPath("libc.so.6")
	if err != nil {
		t.Fatal(err)
	}
	if !filepath.IsAbs(libc) || !hostELF(libc) {
		t.Errorf("LookPath(libc.so.6) = %s", libc)
	}
	if p, err := LookPath("sh"); err != nil || !strings.HasSuffix(p, "/sh") {
		t.Errorf("LookPath(sh) = %s, %v", p, err)
	}
	if _, err := LookPath("libdoesnotexist.so.9"); !errors.Is(err, ErrNotFound) || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("LookPath(missing) = %v", err)
	}
	// A process's root works like a container's.
	self := "/proc/" + itoa(os.Getpid()) + "/root"
	p, err := LookPathIn(self, "libc.so.6")
	if err != nil || !strings.HasPrefix(p, self) {
		t.Errorf("LookPathIn(%s, libc.so.6) = %s, %v", self, p, err)
	}
	if _, err := Resolve(p, "malloc"); err != nil {
		t.Errorf("resolving through %s: %v", p, err)
	}
}

func TestExecutableMappings(t *testing.T) {
	maps, err := ExecutableMappings(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	exe, _ := os.Executable()
	found := false
	for _, m := range maps {
		if m.Path == exe {
			found = true
			if _, err := os.Stat(m.HostPath); err != nil {
				t.Errorf("HostPath %s: %v", m.HostPath, err)
			}
		}
	}
	if !found {
		t.Errorf("ExecutableMappings(self) = %+v, missing %s", maps, exe)
	}
	if _, err := ExecutableMappings(1 << 30); err == nil {
		t.Error("ExecutableMappings of a missing pid succeeded")
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// TestParallel checks that scanning symbols and building sites on several
// CPUs gives what doing it on one does, including where checkExact drops a
// weak definition and leaves a gap in a worker's part of the sites, and
// with the keys sorted by comparison, as for a file past packed keys' reach.
func TestParallel(t *testing.T) {
	t.Parallel() // its splits are its own Files', not the package's
	fx := buildFixtures(t)
	patterns := [][]string{{"*"}, {"wdup", "*"}, {"wdup"}, {"func_*", "!func_beta"}, {"*", "!*a*"}, {"*et_*"}, {"*_*a*", "*var"}}
	for _, bin := range []string{fx.pie, fx.nopie, fx.lib} {
		f, err := Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for _, pats := range patterns {
			want, werr := f.Resolve(pats...)
			for _, n := range []int{1, 2, 3, 7} {
				for _, pack := range []bool{true, false} {
					f.tune = tuning{parallelStrings: n, parallelScan: n, parallelSites: n, cpus: 4, noPack: !pack}
					got, err := f.Resolve(pats...)
					if (err == nil) != (werr == nil) || !reflect.DeepEqual(got, want) {
						t.Errorf("%s %q, parallel from %d, packed keys %v:\n got %v, %v\nwant %v, %v", filepath.Base(bin), pats, n, pack, got, err, want, werr)
					}
				}
			}
			f.tune = defaultTuning
		}
	}
}

// TestSelect checks that a Selection's offsets are its sites', also where a
// weak definition was dropped, and that Sites may be called after the File
// is closed, or while it is: the names and aliases that Sites reads must
// still be mapped.
func TestSelect(t *testing.T) {
	fx := buildFixtures(t)
	for _, pats := range [][]string{{"*"}, {"wdup", "*"}, {"wdup"}, {"func_*", "alias_func"}, {"real_func"}} {
		f, err := Open(fx.pie)
		if err != nil {
			t.Fatal(err)
		}
		want, err := f.Resolve(pats...)
		if err != nil {
			t.Fatal(err)
		}
		for range 20 {
			sel, err := f.Select(pats...)
			if err != nil {
				t.Fatal(err)
			}
			f2, err := Open(fx.pie)
			if err != nil {
				t.Fatal(err)
			}
			sel2, err := f2.Select(pats...)
			if err != nil {
				t.Fatal(err)
			}
			closed := make(chan error)
			go func() { closed <- f2.Close() }()
			if s := sel2.Sites(); !reflect.DeepEqual(s, want) {
				t.Errorf("%q: Sites() while Close = %v, want %v", pats, s, want)
			}
			if err := <-closed; err != nil {
				t.Fatal(err)
			}
			if s := sel.Sites(); !reflect.DeepEqual(s, want) {
				t.Errorf("%q: Sites() = %v, want %v", pats, s, want)
			}
		}
		f.Close()
	}
	for _, pats := range [][]string{{"*"}, {"wdup", "*"}, {"wdup"}, {"func_*", "alias_func"}, {"real_func"}} {
		f, err := Open(fx.nopie)
		if err != nil {
			t.Fatal(err)
		}
		want, err := f.Resolve(pats...)
		if err != nil {
			t.Fatal(err)
		}
		sel, err := f.Select(pats...)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan []Site, 2)
		for range 2 {
			go func() { got <- sel.Sites() }()
		}
		for range 2 {
			if s := <-got; !reflect.DeepEqual(s, want) {
				t.Errorf("%q: Sites() = %v, want %v", pats, s, want)
			}
		}
		offs := make([]uint64, len(want))
		for i, s := range want {
			offs[i] = s.Offset
		}
		if !slices.Equal(sel.Offsets(), offs) || sel.Len() != len(want) {
			t.Errorf("%q: Offsets() = %#x (Len %d), want %#x", pats, sel.Offsets(), sel.Len(), offs)
		}
		// The caller's own: changing it changes no later answer.
		if got := sel.Offsets(); len(got) > 0 {
			got[0]++
			if sel.Offsets()[0] != offs[0] {
				t.Errorf("%q: Offsets() shares its slice", pats)
			}
		}
	}
}

// TestRadixSort checks the key sort against a comparison sort for offsets
// of every width a file can have, with ties, which must keep index order.
func TestRadixSort(t *testing.T) {
	for _, tt := range []struct{ n, offBits int }{{300, 1}, {1000, 11}, {5000, 13}, {5000, 24}, {20000, 25}, {3000, 39}} {
		rng := rand.New(rand.NewPCG(uint64(tt.n), uint64(tt.offBits)))
		keys := make([]uint64, tt.n)
		for i := range keys {
			off := rng.Uint64N(1 << tt.offBits)
			if i > 0 && rng.IntN(4) == 0 { // a tie with the previous key
				off = keys[i-1] >> keyBits
			}
			keys[i] = off<<keyBits | uint64(i)
		}
		want := slices.Clone(keys)
		slices.Sort(want)
		radixSort(keys, tt.offBits)
		if !slices.Equal(keys, want) {
			t.Errorf("n=%d offBits=%d: radixSort differs from slices.Sort", tt.n, tt.offBits)
		}
	}
}

// TestMarkNeedleSplit checks that searching a string table in two ranges
// marks what searching it whole does, wherever the split falls: in a
// needle, in a name, at a NUL.
func TestMarkNeedleSplit(t *testing.T) {
	strs := []byte("\x00")
	for i := range 40 {
		strs = append(strs, fmt.Sprintf("mod%d_func_%03d\x00x_func_0%d\x00", i%3, i, i)...)
	}
	for _, needle := range []string{"_func_0", "func_01", "d1_f", "_0"} {
		whole := make(bitmap, (len(strs)+63)/64)
		markNeedle(whole, strs, []byte(needle), 0, len(strs))
		if slices.Equal(whole, make(bitmap, len(whole))) {
			t.Fatalf("%q: nothing found", needle)
		}
		for split := 1; split < len(strs); split++ {
			b := make(bitmap, len(whole))
			markNeedle(b, strs, []byte(needle), 0, split)
			markNeedle(b, strs, []byte(needle), split, len(strs))
			if !slices.Equal(b, whole) {
				t.Fatalf("%q split at %d: marks differ from one search", needle, split)
			}
		}
	}
}

// TestAgainstDebugELF resolves "*" in the fixtures and system binaries and
// checks every site against debug/elf's decoding of the same tables: the
// sites are the addresses with an unversioned or default-version function
// symbol, or a hidden version of a function that has no other (glibc's
// fattach@GLIBC_2.2.5), and each site's names, primary and aliases, are exactly the
// function names at its address ("name@VERSION" for a hidden version).
func TestAgainstDebugELF(t *testing.T) {
	fx := buildFixtures(t)
	bins := []string{fx.pie, fx.nopie, fx.shifted, fx.lib}
	for _, name := range []string{"bash", "libc.so.6"} {
		if p, err := LookPath(name); err == nil {
			bins = append(bins, p)
		}
	}
	for _, bin := range bins {
		t.Run(filepath.Base(bin), func(t *testing.T) {
			ef, err := elf.Open(bin)
			if err != nil {
				t.Fatal(err)
			}
			defer ef.Close()
			type want struct {
				names    map[string]bool
				selected bool
			}
			byAddr := map[uint64]*want{}
			plain := map[string]bool{} // names with a default or no version
			type hiddenAt struct {
				addr uint64
				bare string
			}
			var hidden []hiddenAt
			add := func(syms []elf.Symbol, dynamic bool) {
				for _, s := range syms {
					typ := elf.ST_TYPE(s.Info)
					if (typ != elf.STT_FUNC && typ != elf.STT_GNU_IFUNC) || s.Section == elf.SHN_UNDEF || s.Value == 0 {
						continue
					}
					name, isDefault := s.Name, true
					switch {
					case dynamic && s.HasVersion && s.Version != "" && s.VersionIndex.IsHidden():
						name, isDefault = s.Name+"@"+s.Version, false
					case !dynamic && strings.Contains(s.Name, "@@"):
						name, _, _ = strings.Cut(s.Name, "@@")
					case !dynamic && strings.Contains(s.Name, "@"):
						isDefault = false
					}
					bare, _, _ := strings.Cut(name, "@")
					if isDefault {
						plain[bare] = true
					} else {
						hidden = append(hidden, hiddenAt{s.Value, bare})
					}
					w := byAddr[s.Value]
					if w == nil {
						w = &want{names: map[string]bool{}}
						byAddr[s.Value] = w
					}
					w.names[name] = true
					w.selected = w.selected || isDefault
				}
			}
			syms, _ := ef.Symbols()
			dyn, _ := ef.DynamicSymbols()
			add(syms, false)
			add(dyn, true)
			// A stripped binary's debug file (libc6-dbg's) adds its
			// .symtab.
			if f, err := Open(bin); err == nil {
				if dbg := f.DebugFile(); dbg != "" {
					d, err := elf.Open(dbg)
					if err != nil {
						t.Fatal(err)
					}
					dsyms, _ := d.Symbols()
					d.Close()
					add(dsyms, false)
				}
				f.Close()
			}
			for _, h := range hidden {
				if !plain[h.bare] {
					byAddr[h.addr].selected = true
				}
			}

			sites, err := Resolve(bin, "*")
			if err != nil {
				t.Fatal(err)
			}
			got := map[uint64]bool{}
			for _, s := range sites {
				got[s.Address] = true
				w := byAddr[s.Address]
				if w == nil || !w.selected {
					t.Errorf("site %s at %#x: no default or unversioned function there", s.Name, s.Address)
					continue
				}
				names := map[string]bool{s.Name: true}
				for _, a := range s.Aliases {
					names[a] = true
				}
				if !maps.Equal(names, w.names) {
					t.Errorf("site at %#x: names %v, debug/elf %v", s.Address, slices.Sorted(maps.Keys(names)), slices.Sorted(maps.Keys(w.names)))
				}
			}
			for addr, w := range byAddr {
				if w.selected && !got[addr] {
					t.Errorf("%#x (%v): no site", addr, slices.Sorted(maps.Keys(w.names)))
				}
			}
		})
	}
}

// TestSelectionHold checks that a Selection keeps the symbol tables mapped
// past its File's Close only until it has built its Sites, or is garbage:
// a plan that never asks for names must not keep a big binary's tables.
func TestSelectionHold(t *testing.T) {
	fx := buildFixtures(t)
	mapped := func() bool {
		b, err := os.ReadFile("/proc/self/maps")
		if err != nil {
			t.Fatal(err)
		}
		return bytes.Contains(b, []byte(fx.pie))
	}
	open := func() (*File, *Selection) {
		f, err := Open(fx.pie)
		if err != nil {
			t.Fatal(err)
		}
		s, err := f.Select("*")
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		return f, s
	}
	f, s := open()
	if !mapped() {
		t.Fatal("tables unmapped while a Selection still needs them")
	}
	if len(s.Sites()) == 0 {
		t.Fatal("no sites")
	}
	if mapped() {
		t.Fatal("tables still mapped after the Selection built its Sites and the File was closed")
	}
	if _, err := f.Select("*"); err == nil {
		t.Fatal("Select on a closed File succeeded")
	}

	_, s = open()
	s = nil
	for i := 0; mapped(); i++ {
		if i == 100 {
			t.Fatal("tables still mapped after the Selection became garbage")
		}
		runtime.GC()
		runtime.Gosched()
	}
	_ = s
}

// TestGoEntries checks that the entry sites of a Go program's functions
// are past their stack checks, for x86-64 and arm64, with and without a
// symbol table, and that a function without a check keeps its symbol's
// address. That the kernel then counts each call once, stack growth or
// not, the root package's TestGoStackGrowth checks.
func TestGoEntries(t *testing.T) {
	for _, goarch := range []string{"amd64", "arm64"} {
		for _, stripped := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stripped=%v", goarch, stripped), func(t *testing.T) {
				path, err := testprogs.BuildGoTarget(goarch, stripped)
				if errors.Is(err, os.ErrNotExist) {
					testutil.RequireTool(t, "go", err)
				}
				if err != nil {
					t.Fatal(err)
				}
				f, err := Open(path)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				if !f.IsGo() {
					t.Fatal("IsGo() = false")
				}
				sites, err := f.Resolve(testprogs.GoTargetFuncs...)
				if err != nil {
					t.Fatal(err)
				}
				if len(sites) != len(testprogs.GoTargetFuncs) {
					t.Fatalf("%d sites: %v", len(sites), sites)
				}
				for _, s := range sites {
					// Leaf is nosplit; Pair is a leaf with a small
					// frame, which the compiler leaves unchecked too.
					want := MovedGoStackCheck
					if s.Name == "main.Leaf" || s.Name == "main.Pair" {
						want = NotMoved
					}
					if s.Moved != want || (want != NotMoved) != (s.Offset > s.SymbolOffset) {
						t.Errorf("%s: offset %#x, symbol %#x, moved %v; want moved %v", s.Name, s.Offset, s.SymbolOffset, s.Moved, want)
					}
				}
				checkOffsets(t, path, sites)
			})
		}
	}
}

// TestGoReturns checks the return instructions GoReturns finds against
// those go tool objdump lists, for x86-64 and arm64.
func TestGoReturns(t *testing.T) {
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	for _, goarch := range []string{"amd64", "arm64"} {
		t.Run(goarch, func(t *testing.T) {
			path, err := testprogs.BuildGoTarget(goarch, false)
			if errors.Is(err, os.ErrNotExist) {
				testutil.RequireTool(t, "go", err)
			}
			if err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(gobin, "tool", "objdump", "-s", `^main\.(Deep|Big|Leaf|Pair)$`, path).Output()
			testutil.RequireTool(t, "go tool objdump", err)
			// want[function] = addresses of its RET instructions.
			want := map[string][]uint64{}
			fn := ""
			for _, line := range strings.Split(string(out), "\n") {
				if rest, ok := strings.CutPrefix(line, "TEXT "); ok {
					fn, _, _ = strings.Cut(rest, "(SB)")
					want[fn] = []uint64{}
					continue
				}
				fields := strings.Fields(line)
				if len(fields) >= 4 && fields[3] == "RET" {
					addr, err := strconv.ParseUint(strings.TrimPrefix(fields[1], "0x"), 16, 64)
					if err != nil {
						t.Fatal(err)
					}
					want[fn] = append(want[fn], addr)
				}
			}
			f, err := Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			sel, err := f.Select(testprogs.GoTargetFuncs...)
			if err != nil {
				t.Fatal(err)
			}
			rets, err := sel.GoReturns()
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range sel.Sites() {
				var got []uint64
				for _, off := range rets[i] {
					got = append(got, off-s.SymbolOffset+s.Address)
				}
				if w := want[s.Name]; len(w) == 0 || !slices.Equal(got, w) {
					t.Errorf("%s: returns at %#x, objdump says %#x", s.Name, got, w)
				}
			}
		})
	}
}

// TestGoEntryARM64 checks where goEntryARM64 finds an arm64 Go function's
// body: after B.LS, past the check in its three forms and a restartable
// sequence after it, and nothing for a function without one.
func TestGoEntryARM64(t *testing.T) {
	word := func(ws ...uint32) []byte {
		var b []byte
		for _, w := range ws {
			b = binary.LittleEndian.AppendUint32(b, w)
		}
		return b
	}
	for _, c := range []struct {
		name string
		code []byte
		want int
	}{
		// MOVD 16(R28), R16; CMP R16, RSP; BLS; MOVD.W R30, -96(RSP)
		{"small frame", word(0xf9400b90, 0xeb3063ff, 0x54000449, 0xf81a0ffe), 12},
		// MOVD 16(R28), R16; SUB $160, RSP, R17; CMP R16, R17; BLS
		{"large frame", word(0xf9400b90, 0xd10283f1, 0xeb10023f, 0x54000509, 0xd10483f4), 16},
		// MOVD 16(R28), R16; MOVD $8080, R27; SUBS R27, RSP, R17; BCC; CMP R16, R17; BLS
		{"huge frame", word(0xf9400b90, 0xd283f21b, 0xeb3b63f1, 0x540005a3, 0xeb10023f, 0x54000569, 0xa93ffa9d), 24},
		// ... then MOVD $8208, R27; SUB R27, RSP, R20, which Go restarts
		// from the MOVD when preempted at the SUB; STP (R29, R30), -8(R20)
		{"huge frame, restartable", word(0xf9400b90, 0xd283f21b, 0xeb3b63f1, 0x540005a3, 0xeb10023f, 0x54000569, 0xd284021b, 0xcb3b63f4, 0xa93ffa9d), 32},
		{"huge frame, window ends in the sequence", word(0xf9400b90, 0xd283f21b, 0xeb3b63f1, 0x540005a3, 0xeb10023f, 0x54000569, 0xd284021b, 0xcb3b63f4), 0},
		// MOVD.W R30, -32(RSP): no check
		{"no check", word(0xf81e0ffe, 0xd65f03c0), 0},
		{"empty", nil, 0},
	} {
		if got := goEntryARM64(c.code); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}
