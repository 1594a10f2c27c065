package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/multiprobe/multiprobe"
)

// cliEnv makes the test binary, started again by execCLI, run as the
// multiprobe command with its arguments.
const cliEnv = "MULTIPROBE_CLI_MAIN"

// cliCommand is the CLI with args as a command of its own: this test
// binary, which TestMain runs as the CLI.
func cliCommand(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), cliEnv+"=1")
	return cmd
}

// execCLI runs the CLI as a user does: a process of its own with these
// arguments, its exit status and its two outputs apart.
func execCLI(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := cliCommand(t, args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return o.String(), e.String(), code
}

func TestHelp(t *testing.T) {
	tests := []struct {
		name string
		args []string
		code int
		// stdout must contain each of these; "" for nothing on stdout.
		stdout []string
		stderr string
	}{
		{"no args", nil, 2, nil, "usage: multiprobe COMMAND"},
		{"help", []string{"help"}, 0, []string{"usage: multiprobe COMMAND", "count", "list", "usdt", "load"}, ""},
		{"-h", []string{"-h"}, 0, []string{"usage: multiprobe COMMAND"}, ""},
		{"--help", []string{"--help"}, 0, []string{"usage: multiprobe COMMAND"}, ""},
		{"help list", []string{"help", "list"}, 0, []string{"usage: multiprobe list", "--json", "examples:"}, ""},
		{"list -h", []string{"list", "-h"}, 0, []string{"usage: multiprobe list", "--json"}, ""},
		{"count --help", []string{"count", "--help"}, 0, []string{"usage: multiprobe count", "--duration", "--pid", "--args", "examples:"}, ""},
		{"usdt -h", []string{"usdt", "-h"}, 0, []string{"usage: multiprobe usdt", "examples:"}, ""},
		{"load --help", []string{"load", "--help"}, 0, []string{"usage: multiprobe load", "--jobs", "examples:"}, ""},
		{"help after args", []string{"list", "/bin/sh", "--help"}, 0, []string{"usage: multiprobe list"}, ""},
		{"help unknown", []string{"help", "frob"}, 2, nil, "unknown command"},
		{"unknown", []string{"frob"}, 2, nil, "unknown command"},
		{"bad flag", []string{"count", "--nope", "uprobe:/bin/sh:x"}, 2, nil, "unknown flag --nope (see: multiprobe help count)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stdout, stderr, code := execCLI(t, tt.args...)
			if code != tt.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, stdout, stderr)
			}
			for _, want := range tt.stdout {
				if !strings.Contains(stdout, want) {
					t.Errorf("stdout does not contain %q:\n%s", want, stdout)
				}
			}
			if tt.stdout == nil && stdout != "" {
				t.Errorf("stdout = %q, want nothing", stdout)
			}
			if !strings.Contains(stderr, tt.stderr) {
				t.Errorf("stderr does not contain %q:\n%s", tt.stderr, stderr)
			}
			if tt.code == 0 && stderr != "" {
				t.Errorf("stderr = %q, want nothing", stderr)
			}
			if tt.code == 2 && tt.args != nil && strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
				t.Errorf("usage error is not one line: %q", stderr)
			}
		})
	}
}

func TestProgressLine(t *testing.T) {
	var b bytes.Buffer
	writeProgress(&b, multiprobe.Progress{Phase: "attach", Path: "/bin/bash", Done: 3, Total: 10})
	writeProgress(&b, multiprobe.Progress{Phase: "attach", Path: "/bin/bash", Done: 10, Total: 10})
	want := "\rattaching 3/10 sites of /bin/bash (one perf-event uprobe each)\x1b[K" +
		"\rattaching 10/10 sites of /bin/bash (one perf-event uprobe each)\x1b[K\n"
	if b.String() != want {
		t.Errorf("got %q, want %q", b.String(), want)
	}
	// Piped, nothing.
	if terminalProgress(&b) != nil || terminalProgress(os.Stdout) != nil && !isTerminal(os.Stdout) {
		t.Error("progress for a writer that is not a terminal")
	}
}
