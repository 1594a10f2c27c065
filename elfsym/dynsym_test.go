package elfsym

import (
	"debug/elf"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/multiprobe/multiprobe/internal/testprogs"
)

// TestDynsymCovered resolves every function of real binaries with .dynsym
// skipped where .symtab covers it, and with both read: the sites must be
// the same, names, aliases, versions and all.
func TestDynsymCovered(t *testing.T) {
	// Real binaries with both tables are few on a Debian system (its
	// packages are stripped): node, this test binary, and the targets the
	// tests build (executables, a shared library with exported and
	// aliased functions, IFUNCs, Go).
	fx := testprogs.USDTFixturesFor(t, "")
	self, _ := os.Executable()
	corpus := []string{"/usr/bin/node", "/bin/bash", "/usr/bin/python3.11", self,
		testprogs.BuildTarget(t, 100), testprogs.IFuncTarget(t), testprogs.GoTarget(t, false), fx.Lib, fx.Exe, fx.ExeNoPIE}
	for _, dir := range []string{"/usr/bin", "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu"} {
		names, _ := filepath.Glob(filepath.Join(dir, "*"))
		for _, n := range names {
			if len(corpus) > 400 {
				break
			}
			corpus = append(corpus, n)
		}
	}
	skipped := 0
	for _, path := range corpus {
		ef, err := elf.Open(path)
		if err != nil {
			continue
		}
		hasSymtab := ef.Section(".symtab") != nil && ef.Section(".dynsym") != nil
		ef.Close()
		if !hasSymtab {
			continue
		}
		if st, err := os.Stat(path); err != nil || !st.Mode().IsRegular() {
			continue
		}
		fast, slow := sitesOf(t, path, true), sitesOf(t, path, false)
		if fast == nil || slow == nil {
			continue
		}
		if fast.skipped {
			skipped++
		}
		if !reflect.DeepEqual(fast.sites, slow.sites) {
			t.Errorf("%s: %d sites with .dynsym skipped, %d with it read, or they differ", path, len(fast.sites), len(slow.sites))
			for i := range min(len(fast.sites), len(slow.sites)) {
				if !reflect.DeepEqual(fast.sites[i], slow.sites[i]) {
					t.Errorf("first difference: %+v vs %+v", fast.sites[i], slow.sites[i])
					break
				}
			}
		}
	}
	if skipped == 0 {
		t.Skip("no binary here has a .symtab that covers its .dynsym")
	}
	t.Logf("%d binaries read without their .dynsym, the same sites", skipped)
}

type resolved struct {
	sites   []Site
	skipped bool
}

func sitesOf(t *testing.T, path string, skip bool) *resolved {
	t.Helper()
	skipCoveredDynsym = skip
	defer func() { skipCoveredDynsym = true }()
	f, err := Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	r := &resolved{skipped: len(f.tables) == 1 && !f.tables[0].dynamic && f.pclntab == nil}
	sel, err := f.Select("*")
	if err != nil {
		return &resolved{}
	}
	r.sites = sel.Sites()
	return r
}
