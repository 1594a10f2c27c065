package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
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

// TestArchive writes an archive and reads it back as the kernel's
// unpacker does: newc headers, names and data each padded to four bytes.
func TestArchive(t *testing.T) {
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
	got := map[string]string{} // name -> mode and contents
	b := buf.Bytes()
	for {
		if len(b) < 110 || string(b[:6]) != "070701" {
			t.Fatalf("bad header at %d bytes from the end: %q", len(b), b[:min(len(b), 16)])
		}
		field := func(i int) int {
			v, err := strconv.ParseUint(string(b[6+8*i:14+8*i]), 16, 32)
			if err != nil {
				t.Fatal(err)
			}
			return int(v)
		}
		mode, size, namesize := field(1), field(6), field(11)
		name := string(b[110 : 110+namesize-1])
		at := 110 + namesize
		at += pad4(at)
		data := string(b[at : at+size])
		at += size + pad4(size)
		b = b[at:]
		if name == "TRAILER!!!" {
			break
		}
		got[name] = fmt.Sprintf("%o %s", mode, data)
	}
	if len(b) != 0 {
		t.Errorf("%d bytes after the trailer", len(b))
	}
	for name, want := range map[string]string{
		"init":            "100755 odd length",
		"lib64":           "120777 usr/lib64",
		"usr/lib64/ld.so": "100755 #!/bin/sh\n",
		"usr":             "40755 ",
	} {
		if got[name] != want {
			t.Errorf("%s: %q, want %q", name, got[name], want)
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

// TestReadConsole reads a guest's console: the status line is kept out of
// the output, and a program a test could not run is named, with the flag
// that gives it to the guest.
func TestReadConsole(t *testing.T) {
	console := strings.Join([]string{
		"=== RUN   TestBash",
		"    x_test.go:12: fork/exec /bin/bash: no such file or directory",
		`    y_test.go:7: exec: "python3": executable file not found in $PATH`,
		"    x_test.go:20: fork/exec /bin/bash: no such file or directory",
		"FAIL example.com/x 0.1s (exit 1)",
		marker + "1",
	}, "\r\n")
	var out bytes.Buffer
	status, missing := readConsole(strings.NewReader(console), &out)
	if status != 1 {
		t.Errorf("status %d, want 1", status)
	}
	if strings.Contains(out.String(), marker) || !strings.Contains(out.String(), "FAIL example.com/x") {
		t.Errorf("console copied as:\n%s", out.String())
	}
	if !slices.Equal(missing, []string{"/bin/bash", "python3"}) {
		t.Errorf("missing %q, want /bin/bash and python3", missing)
	}
	if hint, want := filesHint(missing), "; the guest has no /bin/bash or python3, which a test ran: copy it in with -files /bin/bash,python3"; hint != want {
		t.Errorf("hint %q, want %q", hint, want)
	}
	if status, missing := readConsole(strings.NewReader("panic\n"), io.Discard); status != -1 || missing != nil {
		t.Errorf("no status line: %d, %q", status, missing)
	}
}

// TestVerbose: vmrun's -v runs the tests with -test.v, before the user's
// own test flags, once.
func TestVerbose(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want []string
	}{
		{[]string{"-v", "./..."}, []string{"-test.v"}},
		{[]string{"-v", "./...", "--", "-run", "X", "arg"}, []string{"-test.v", "-test.run", "X", "arg"}},
		{[]string{"-v", "./...", "--", "-v"}, []string{"-test.v"}},
		{[]string{"./...", "--", "-run", "X"}, []string{"-test.run", "X"}},
	} {
		o, err := parseArgs(tt.args, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(o.flags, tt.want) {
			t.Errorf("%q: test flags %q, want %q", tt.args, o.flags, tt.want)
		}
	}
}
