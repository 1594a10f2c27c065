package usdt

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/multiprobe/multiprobe/internal/testutil"
)

// targets are the C programs of testdata, built once per test binary.
type targets struct {
	lib      string // libmptest.so, -O2
	exe      string // probes, -O2, PIE
	exeO0    string // probes, -O0: every argument a memory operand
	exeNoPIE string // probes, -O2, -no-pie: addresses are runtime addresses
}

var (
	buildOnce sync.Once
	built     targets
	buildErr  error
	buildDir  string

	sdtOnce sync.Once
	sdtErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

func buildTargets(t testing.TB) targets {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	testutil.RequireTool(t, "gcc", err)
	sdtOnce.Do(func() {
		cmd := exec.Command(gcc, "-E", "-x", "c", "-o", os.DevNull, "-")
		cmd.Stdin = strings.NewReader("#include <sys/sdt.h>\n")
		if out, err := cmd.CombinedOutput(); err != nil {
			sdtErr = fmt.Errorf("%w: <sys/sdt.h> (systemtap-sdt-dev): %s", os.ErrNotExist, out)
		}
	})
	testutil.RequireTool(t, "sys/sdt.h", sdtErr)
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "usdt-test-")
		if buildErr != nil {
			return
		}
		src, _ := filepath.Abs("testdata")
		d := buildDir
		built = targets{
			lib:      filepath.Join(d, "libmptest.so"),
			exe:      filepath.Join(d, "probes"),
			exeO0:    filepath.Join(d, "probes-O0"),
			exeNoPIE: filepath.Join(d, "probes-nopie"),
		}
		main := []string{"-I" + src, filepath.Join(src, "probes.c"), filepath.Join(src, "sema.c"),
			"-L" + d, "-lmptest", "-Wl,-rpath," + d}
		cmds := [][]string{
			{"-O2", "-g", "-shared", "-fPIC", "-o", built.lib, filepath.Join(src, "libmptest.c")},
			append([]string{"-O2", "-g", "-o", built.exe}, main...),
			append([]string{"-O0", "-g", "-o", built.exeO0}, main...),
			append([]string{"-O2", "-g", "-no-pie", "-fno-pie", "-o", built.exeNoPIE}, main...),
		}
		for _, args := range cmds {
			out, err := exec.Command(gcc, args...).CombinedOutput()
			if err != nil {
				buildErr = fmt.Errorf("gcc %v: %v\n%s", args, err, out)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return built
}
