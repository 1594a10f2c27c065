package elfsym

import (
	"bufio"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/multiprobe/multiprobe/internal/glob"
)

const bigFuncs = 200_000

var (
	bigOnce sync.Once
	bigPath string
	bigErr  error
)

// bigBinary builds, once per run, an executable with bigFuncs functions
// named like a large C++ or Go program's ("modNNN_func_NNNNNN"). It is
// written as assembly: gcc would take minutes to compile as many C
// functions, and only the symbol tables matter here.
func bigBinary(b *testing.B) string {
	bigOnce.Do(func() {
		dir, err := os.MkdirTemp("", "elfsym-big")
		if err != nil {
			bigErr = err
			return
		}
		asm := filepath.Join(dir, "big.s")
		f, err := os.Create(asm)
		if err != nil {
			bigErr = err
			return
		}
		w := bufio.NewWriter(f)
		fmt.Fprintln(w, ".text")
		for i := 0; i < bigFuncs; i++ {
			name := fmt.Sprintf("mod%03d_func_%06d", i%1000, i)
			fmt.Fprintf(w, ".globl %[1]s\n.type %[1]s, @function\n%[1]s:\n\tnop\n\tret\n.size %[1]s, 2\n", name)
		}
		w.Flush()
		f.Close()
		main := filepath.Join(dir, "main.c")
		os.WriteFile(main, []byte("int main(void) { return 0; }\n"), 0o644)
		bigPath = filepath.Join(dir, "big")
		cmd := exec.Command("gcc", "-o", bigPath, main, asm)
		if out, err := cmd.CombinedOutput(); err != nil {
			bigErr = fmt.Errorf("gcc: %w\n%s", err, out)
		}
		os.Remove(asm)
	})
	if bigErr != nil {
		b.Skipf("building the big binary: %v", bigErr)
	}
	return bigPath
}

var benchPatterns = []struct {
	name     string
	patterns []string
}{
	{"exact", []string{"mod150_func_150150"}},
	{"prefix", []string{"mod012_*"}},                                   // 200 functions
	{"suffix", []string{"*_func_0001??"}},                              // 100 functions
	{"several+exclusion", []string{"mod00[1-3]_*", "mod999_*", "!*7"}}, // ~720
	{"all", []string{"mod*"}},                                          // 200,000
}

// BenchmarkResolve compares elfsym with the obvious debug/elf approach on the
// same file and patterns: decode every symbol with Symbols() and
// DynamicSymbols(), match each name, convert addresses with the program
// headers. Compare the two with benchstat:
//
//	go test -run='^$' -bench=Resolve -count=10 ./elfsym | tee /tmp/r.txt
//	benchstat -col /impl /tmp/r.txt
func BenchmarkResolve(b *testing.B) {
	path := bigBinary(b)
	for _, bp := range benchPatterns {
		b.Run("impl=elfsym/patterns="+bp.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				f, err := Open(path)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := f.Resolve(bp.patterns...); err != nil {
					b.Fatal(err)
				}
				f.Close()
			}
		})
		b.Run("impl=debugelf/patterns="+bp.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if n := resolveDebugELF(b, path, bp.patterns); n == 0 {
					b.Fatal("no match")
				}
			}
		})
	}
}

// resolveDebugELF is the baseline: what a tool built on debug/elf does.
func resolveDebugELF(b *testing.B, path string, patterns []string) int {
	f, err := elf.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	var incl, excl []*glob.Pattern
	for _, p := range patterns {
		if p[0] == '!' {
			excl = append(excl, glob.MustCompile(p[1:]))
		} else {
			incl = append(incl, glob.MustCompile(p))
		}
	}
	syms, _ := f.Symbols()
	dyn, _ := f.DynamicSymbols()
	offsets := map[uint64]string{}
	for _, s := range append(syms, dyn...) {
		if t := elf.ST_TYPE(s.Info); (t != elf.STT_FUNC && t != elf.STT_GNU_IFUNC) || s.Section == elf.SHN_UNDEF || s.Value == 0 {
			continue
		}
		ok := false
		for _, p := range incl {
			if p.MatchString(s.Name) {
				ok = true
				break
			}
		}
		for _, p := range excl {
			if ok && p.MatchString(s.Name) {
				ok = false
			}
		}
		if !ok {
			continue
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_LOAD && p.Flags&elf.PF_X != 0 && s.Value >= p.Vaddr && s.Value < p.Vaddr+p.Filesz {
				offsets[s.Value-p.Vaddr+p.Off] = s.Name
			}
		}
	}
	return len(offsets)
}

// TestBenchmarkAgrees checks that the baseline and elfsym select the same
// sites, so the benchmark compares equal work.
func TestBenchmarkAgrees(t *testing.T) {
	fx := buildFixtures(t)
	for _, pats := range [][]string{{"func_*", "!*beta"}, {"*"}} {
		sites, err := Resolve(fx.nopie, pats...)
		if err != nil {
			t.Fatal(err)
		}
		f, _ := elf.Open(fx.nopie)
		syms, _ := f.Symbols()
		f.Close()
		want := map[uint64]bool{}
		for _, s := range syms {
			if t := elf.ST_TYPE(s.Info); (t == elf.STT_FUNC || t == elf.STT_GNU_IFUNC) && s.Section != elf.SHN_UNDEF && s.Value != 0 {
				keep := false
				for _, p := range pats {
					if p[0] != '!' && glob.MustCompile(p).MatchString(s.Name) {
						keep = true
					}
				}
				for _, p := range pats {
					if p[0] == '!' && glob.MustCompile(p[1:]).MatchString(s.Name) {
						keep = false
					}
				}
				if keep {
					want[s.Value] = true
				}
			}
		}
		if len(sites) != len(want) {
			t.Errorf("%q: elfsym found %d sites, debug/elf %d addresses", pats, len(sites), len(want))
		}
		for _, s := range sites {
			if !want[s.Address] {
				t.Errorf("%q: elfsym site %s not found by debug/elf", pats, s.Name)
			}
		}
	}
}
