package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/multiprobe/multiprobe/elfsym"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/probetest"
)

func TestMain(m *testing.M) {
	if os.Getenv(calibrateEnv) != "" {
		runCalibration()
	}
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
			// A target of 50 functions (testprogs.Target), which a
			// script copies before it probes it.
			if os.Geteuid() == 0 {
				many, err := testprogs.Target(50)
				if err != nil {
					return err
				}
				env.Setenv("MANYFUNCS", many)
			}
			return nil
		},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"waitfile":      waitFile,
			"waitmatch":     waitMatch,
			"envfile":       envFile,
			"foreignuprobe": foreignUprobe,
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

// scriptWait is how long waitfile and waitmatch wait.
const scriptWait = 30 * time.Second

// waitFile is the scripts' "waitfile FILE": it waits for FILE to exist
// (a target started in the background writes it when it is ready).
func waitFile(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: waitfile FILE")
	}
	for deadline := time.Now().Add(scriptWait); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(ts.MkAbs(args[0])); err == nil {
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("%s did not appear in %v", args[0], scriptWait)
		}
	}
}

// waitMatch is the scripts' "waitmatch FILE REGEXP": it waits for a line
// of FILE to match (a command in the background writes its stderr there,
// and says when it has attached).
func waitMatch(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: waitmatch FILE REGEXP")
	}
	re, err := regexp.Compile("(?m)" + args[1])
	ts.Check(err)
	var b []byte
	for deadline := time.Now().Add(scriptWait); ; time.Sleep(10 * time.Millisecond) {
		b, _ = os.ReadFile(ts.MkAbs(args[0]))
		if re.Match(b) {
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("no line of %s matched %q in %v; it holds:\n%s", args[0], args[1], scriptWait, b)
		}
	}
}

// envFile is the scripts' "envfile VAR FILE": VAR is set to what FILE
// holds, without its trailing white space (a pid, say).
func envFile(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: envfile VAR FILE")
	}
	ts.Setenv(args[0], strings.TrimSpace(ts.ReadFile(args[1])))
}

// foreignUprobe is the scripts' "foreignuprobe FILE FUNCTION REFCTR": it
// holds, until the script ends, a perf-event uprobe at FUNCTION of FILE
// with the ref-counter offset REFCTR, as another tracer leaves one
// (testprogs.ForeignUprobe).
func foreignUprobe(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 3 {
		ts.Fatalf("usage: foreignuprobe FILE FUNCTION REFCTR")
	}
	path := ts.MkAbs(args[0])
	sites, err := elfsym.Resolve(path, args[1])
	ts.Check(err)
	refCtr, err := strconv.ParseUint(args[2], 0, 64)
	ts.Check(err)
	closeFn, err := testprogs.ForeignUprobe(path, sites[0].Offset, refCtr)
	ts.Check(err)
	ts.Defer(closeFn)
}
