package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/probetest"
)

// TestHelpExamples runs every example of every command's help as a user
// would paste it into a shell, and wants exit status 0. What a user would
// fill in is filled in: PID 1234 is a waiting python3.11's pid (it has
// USDT probes, and libc), probes.bpf.o
// the loader's test object, durations of seconds a fraction of one, and
// nginx, which this machine lacks, bash. profile and count --profile meter
// programs with fentry, which the host kernel does not load: their
// examples run in the guests (TestProfileCommand, TestCountProfile).
func TestHelpExamples(t *testing.T) {
	probetest.RequireBPF(t)
	if testutil.InGuest() {
		t.Skip("the examples name the host's programs and libraries; the guests run the commands' own tests")
	}
	sleeper := exec.Command("/usr/bin/python3.11", "-c", "import time; time.sleep(600)")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sleeper.Process.Kill(); sleeper.Wait() })
	dir := t.TempDir()
	obj, err := os.ReadFile(loadTestObject)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "probes.bpf.o"), obj, 0o644); err != nil {
		t.Fatal(err)
	}
	fill := strings.NewReplacer(
		"1234", strconv.Itoa(sleeper.Process.Pid),
		"--duration 10s", "--duration 0.2s",
		"--duration 10", "--duration 0.2",
		"--duration 5", "--duration 0.2",
		"/usr/sbin/nginx:ngx_http_*", "/bin/bash:sh_*",
	)
	names := make([]string, 0, len(commands))
	for name := range commands {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		for i, ex := range commands[name].examples {
			t.Run(name+"/"+strconv.Itoa(i), func(t *testing.T) {
				line, _, _ := strings.Cut(ex, "  # ")
				line = strings.TrimSpace(line)
				if name == "profile" || strings.Contains(line, "--profile") {
					t.Skipf("%q meters a program through fentry, which this kernel does not load", line)
				}
				cmd := exec.Command("bash", "-o", "pipefail", "-c", "multiprobe "+fill.Replace(line))
				cmd.Dir = dir
				cmd.Env = append(os.Environ(), "HOME="+dir)
				out, err := cmd.CombinedOutput()
				if err != nil {
					t.Fatalf("multiprobe %s (as run: %s): %v\n%s", line, fill.Replace(line), err, out)
				}
			})
		}
	}
}
