package main

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/internal/testutil"
)

func TestParseSizes(t *testing.T) {
	tests := []struct {
		args []string
		want []int
	}{
		{[]string{"5", "10000"}, []int{5, 10000}},
		{nil, nil},
		{[]string{"0"}, nil},
		{[]string{"x"}, nil},
		{[]string{"100001"}, nil},
	}
	for _, tt := range tests {
		got, err := parseSizes(tt.args)
		if (err != nil) != (tt.want == nil) || len(got) != len(tt.want) {
			t.Errorf("parseSizes(%q) = %v, %v; want %v", tt.args, got, err, tt.want)
			continue
		}
		for i := range got {
			if got[i] != tt.want[i] {
				t.Errorf("parseSizes(%q) = %v, want %v", tt.args, got, tt.want)
			}
		}
	}
}

// TestPrebuild checks that a prebuilt target lands where a test process
// with MULTIPROBE_CACHE_DIR=dst finds it: a second process, which has no
// in-memory build of its own, must use the copy instead of building one.
func TestPrebuild(t *testing.T) {
	if os.Getenv("VMTEST_CHILD") == "1" {
		// The child: gcc is off $PATH, so only a prebuilt copy can work.
		p, err := testprogs.Target(3)
		if err != nil {
			t.Fatal(err)
		}
		os.Stdout.WriteString("TARGET " + p + "\n")
		return
	}
	_, err := exec.LookPath("gcc")
	testutil.RequireTool(t, "gcc", err)
	t.Setenv("MULTIPROBE_CACHE_DIR", t.TempDir()) // the "host" cache
	dst := t.TempDir()
	if err := prebuild(dst, []int{3}); err != nil {
		t.Fatal(err)
	}

	var copies []string
	filepath.WalkDir(dst, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.Contains(p, "/target-") {
			copies = append(copies, p)
		}
		return err
	})
	if len(copies) != 1 {
		t.Fatalf("generated targets under %s: %q, want one", dst, copies)
	}
	want := fmt.Sprintf("done %d\n", testprogs.ExpectedSum(3, 1))
	if out, err := exec.Command(copies[0], "1").Output(); err != nil || string(out) != want {
		t.Errorf("%s 1: %q, %v; want %q", copies[0], out, err, want)
	}

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestPrebuild$")
	cmd.Env = append(os.Environ(), "VMTEST_CHILD=1", "MULTIPROBE_CACHE_DIR="+dst, "PATH=/nonexistent")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child with MULTIPROBE_CACHE_DIR=%s and no gcc: %v\n%s", dst, err, out)
	}
	if want := "TARGET " + copies[0] + "\n"; !strings.Contains(string(out), want) {
		t.Errorf("child output %q, want a line %q", out, want)
	}
}
