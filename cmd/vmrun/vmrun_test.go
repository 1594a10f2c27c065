package main

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseArgs(t *testing.T) {
	o, err := parseArgs([]string{"-kernel", "5.10,6.12", "-env", "A=1", "./x/...", "--", "-run", "TestX", "-v", "--count=2", "-test.short", "arg"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.kernels, []string{"5.10", "6.12"}) || !slices.Equal(o.packages, []string{"./x/..."}) || !slices.Equal(o.env, []string{"A=1"}) {
		t.Errorf("kernels %q, packages %q, env %q", o.kernels, o.packages, o.env)
	}
	if want := []string{"-test.run", "TestX", "-test.v", "-test.count=2", "-test.short", "arg"}; !slices.Equal(o.flags, want) {
		t.Errorf("test flags %q, want %q", o.flags, want)
	}
	for _, bad := range [][]string{{"-kernel", "4.19"}, {"-env", "NOEQUALS"}, {"-accel", "hvf"}} {
		if _, err := parseArgs(bad, io.Discard); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// TestArchive writes an archive and reads it back with cpio(1), as the
// kernel would unpack it.
func TestArchive(t *testing.T) {
	if _, err := exec.LookPath("cpio"); err != nil {
		t.Skip("no cpio to read the archive back")
	}
	src := t.TempDir() + "/prog"
	if err := os.WriteFile(src, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	a := newArchive()
	a.dir("usr", 0o755)
	a.mkdirAll("usr/lib64")
	a.symlink("lib64", "usr/lib64")
	at := a.canonical("/lib64/ld.so")
	if at != "usr/lib64/ld.so" {
		t.Errorf("canonical(/lib64/ld.so) = %s, want usr/lib64/ld.so", at)
	}
	a.file(at, src, 0o755)
	a.data("init", []byte("odd length"), 0o755)
	var buf bytes.Buffer
	if err := a.write(&buf); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("cpio", "-itv")
	cmd.Stdin = &buf
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("cpio: %v\n%s", err, out)
	}
	for _, want := range []string{"init", "lib64 -> usr/lib64", "usr/lib64/ld.so", "-rwxr-xr-x"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("cpio -t lacks %q:\n%s", want, out)
		}
	}
}

func TestInitScript(t *testing.T) {
	o := &options{flags: []string{"-test.run", "Test'Quote"}, env: []string{"X=a b"}, timeout: 20 * time.Minute}
	s := initScript(o, []testPackage{{importPath: "example.com/m/p", dir: "p"}})
	for _, want := range []string{
		`run_pkg 'p' 'example.com/m/p' '-test.run' 'Test'\''Quote'`,
		`export 'X=a b'`,
		"TEST_TIMEOUT=1140s",
		`echo "` + marker + `$status"`,
	} {
		if !strings.Contains(s, want) {
			t.Errorf("init script lacks %q:\n%s", want, s)
		}
	}
}
