package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/probetest"
)

func TestMain(m *testing.M) {
	if os.Getenv(unprivEnv) != "" {
		os.Exit(run([]string{"load", os.Getenv(unprivEnv)}, os.Stdout, os.Stderr))
	}
	if os.Getenv(cliEnv) != "" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	// The scripts run "multiprobe" as a user does: a command on $PATH,
	// which is this test binary under that name.
	testscript.Main(m, map[string]func(){
		"multiprobe": func() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) },
	})
}

// TestScripts runs the CLI's documented sessions in testdata/script: the
// help's examples, the README's commands, and what each error says. Those
// in root/ load BPF programs.
func TestScripts(t *testing.T) {
	if testutil.InGuest() {
		t.Skip("the transcripts run the host's programs and tools (bash, libc, setpriv); in a test VM the commands' own tests cover the kernel's paths")
	}
	t.Run("user", func(t *testing.T) {
		testscript.Run(t, scriptParams("testdata/script"))
	})
	t.Run("root", func(t *testing.T) {
		probetest.RequireBPF(t)
		testscript.Run(t, scriptParams("testdata/script/root"))
	})
}

func scriptParams(dir string) testscript.Params {
	return testscript.Params{
		Dir:                 dir,
		RequireExplicitExec: true,
		RequireUniqueNames:  true,
		Setup: func(env *testscript.Env) error {
			// nobody runs multiprobe in some scripts (setpriv): open the
			// way to the copy on $PATH, which testscript makes in a
			// directory only root may enter.
			exe, err := exec.LookPath("multiprobe")
			if err != nil {
				return err
			}
			for d := filepath.Dir(exe); strings.HasPrefix(d, os.TempDir()+"/"); d = filepath.Dir(d) {
				if err := os.Chmod(d, 0o755); err != nil {
					return err
				}
			}
			if err := os.Chmod(env.WorkDir, 0o755); err != nil {
				return err
			}
			env.Setenv("HOME", env.WorkDir)
			return nil
		},
		Condition: func(cond string) (bool, error) {
			switch cond {
			case "root":
				return os.Geteuid() == 0, nil
			}
			return false, nil
		},
	}
}
