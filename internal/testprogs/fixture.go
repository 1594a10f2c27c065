package testprogs

import (
	"cmp"
	"embed"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"testing"

	"github.com/multiprobe/multiprobe/internal/testutil"
)

//go:embed c/usdt_fixture
var usdtFixtureFS embed.FS

// USDTFixtures are the usdt package's test programs (c/usdt_fixture): a
// probe of every argument form and size, twelve arguments, a struct field,
// an indexed array, a global, one probe inlined at 300 sites, a probe
// with a semaphore, and a shared library with a probe of its own.
type USDTFixtures struct {
	Lib      string // libmptest.so, -O2
	Exe      string // probes, -O2, PIE
	ExeO0    string // probes, -O0: every argument a memory operand
	ExeNoPIE string // probes, -O2, not PIE: addresses are runtime addresses
}

// BuildUSDTFixtures builds the fixtures with the compiler cc, or for ""
// the default (see [CCEnv]), on first use, and caches them like [Target],
// in one directory: the programs find the library beside them ($ORIGIN),
// wherever that directory is copied, as into a VM. A cross compiler (say
// riscv64-linux-gnu-gcc) builds them for its architecture: the usdt
// package decodes the argument strings gcc writes for each.
func BuildUSDTFixtures(cc string) (USDTFixtures, error) {
	var units []unit
	entries, err := usdtFixtureFS.ReadDir("c/usdt_fixture")
	if err != nil {
		return USDTFixtures{}, err
	}
	for _, e := range entries {
		src, err := usdtFixtureFS.ReadFile(path.Join("c/usdt_fixture", e.Name()))
		if err != nil {
			return USDTFixtures{}, err
		}
		units = append(units, unit{name: e.Name(), src: src})
	}
	name := "usdt-fixtures"
	if cc != "" {
		name += "-" + filepath.Base(cc)
	}
	dir, err := cached(name, cc, units, nil, func(tmp string) error {
		var include []string
		if cc != "" {
			// <sys/sdt.h> is architecture-neutral, but Debian installs
			// it in the host's multiarch directory, which a cross
			// compiler does not search.
			inc, err := sdtInclude(tmp)
			if err != nil {
				return err
			}
			include = []string{"-I" + inc}
		}
		src := func(n string) string { return filepath.Join(tmp, n) }
		main := []string{"-I" + tmp, src("probes.c"), src("sema.c"), "-L" + tmp, "-lmptest", "-Wl,-rpath,$ORIGIN"}
		for _, args := range [][]string{
			{"-O2", "-g", "-shared", "-fPIC", "-o", src("libmptest.so"), src("libmptest.c")},
			append([]string{"-O2", "-g", "-o", src("probes")}, main...),
			append([]string{"-O0", "-g", "-o", src("probes-O0")}, main...),
			append([]string{"-O2", "-g", "-no-pie", "-fno-pie", "-o", src("probes-nopie")}, main...),
		} {
			if err := runCC(cc, append(slices.Clone(include), args...)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return USDTFixtures{}, err
	}
	return USDTFixtures{
		Lib:      filepath.Join(dir, "libmptest.so"),
		Exe:      filepath.Join(dir, "probes"),
		ExeO0:    filepath.Join(dir, "probes-O0"),
		ExeNoPIE: filepath.Join(dir, "probes-nopie"),
	}, nil
}

// USDTFixturesFor is [BuildUSDTFixtures] for tests: it skips tb (or fails
// it in CI) when the compiler is missing and fails it when the build fails.
func USDTFixturesFor(tb testing.TB, cc string) USDTFixtures {
	tb.Helper()
	fx, err := BuildUSDTFixtures(cc)
	if errors.Is(err, os.ErrNotExist) {
		testutil.RequireTool(tb, cmp.Or(cc, "gcc"), err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	return fx
}

// sdtInclude copies the host's <sys/sdt.h> into dir/include and returns
// that directory.
func sdtInclude(dir string) (string, error) {
	found, _ := filepath.Glob("/usr/include/*/sys/sdt.h")
	found = append(found, "/usr/include/sys/sdt.h")
	for _, h := range found {
		data, err := os.ReadFile(h)
		if err != nil {
			continue
		}
		inc := filepath.Join(dir, "include")
		if err := os.MkdirAll(filepath.Join(inc, "sys"), 0o755); err != nil {
			return "", err
		}
		if err := os.WriteFile(filepath.Join(inc, "sys", "sdt.h"), data, 0o644); err != nil {
			return "", err
		}
		// sdt.h includes sdt-config.h from beside it.
		if cfg, err := os.ReadFile(filepath.Join(filepath.Dir(h), "sdt-config.h")); err == nil {
			if err := os.WriteFile(filepath.Join(inc, "sys", "sdt-config.h"), cfg, 0o644); err != nil {
				return "", err
			}
		}
		return inc, nil
	}
	return "", fmt.Errorf("testprogs: <sys/sdt.h> (systemtap-sdt-dev): %w", os.ErrNotExist)
}
