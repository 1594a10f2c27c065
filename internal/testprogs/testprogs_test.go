package testprogs

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/probetest"
)

func TestTarget(t *testing.T) {
	const n = 25
	path := BuildTarget(t, n)

	for _, calls := range []int{0, 3} {
		out, err := exec.Command(path, fmt.Sprint(calls)).Output()
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("done %d\n", ExpectedSum(n, calls)); string(out) != want {
			t.Errorf("target %d printed %q, want %q", calls, out, want)
		}
	}
	for _, args := range [][]string{{}, {"x"}, {"-1"}, {"-wait"}, {"1", "2"}} {
		err := exec.Command(path, args...).Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Errorf("target %q: %v, want exit status 2", args, err)
		}
	}

	// -wait: nothing happens before a line arrives.
	cmd := exec.Command(path, "-wait", "1")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(stdout)
	if line, err := r.ReadString('\n'); line != "ready\n" || err != nil {
		t.Fatalf("-wait: first line %q, %v", line, err)
	}
	stdin.Write([]byte("go\n"))
	rest, _ := r.ReadString('\n')
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("done %d\n", ExpectedSum(n, 1)); rest != want {
		t.Errorf("-wait: printed %q, want %q", rest, want)
	}

	syms, err := SymbolOffsets(path)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[uint64]string{}
	for i := range n {
		off, ok := syms[FuncName(i)]
		if !ok {
			t.Fatalf("no symbol %s", FuncName(i))
		}
		if other, dup := seen[off]; dup {
			t.Errorf("%s and %s share offset %#x", FuncName(i), other, off)
		}
		seen[off] = FuncName(i)
		alias, ok := syms[AliasName(i)]
		if ok != HasAlias(i) || ok && alias != off {
			t.Errorf("%s: alias %s present %v at %#x, want present %v at %#x", FuncName(i), AliasName(i), ok, alias, HasAlias(i), off)
		}
	}
	if _, err := TargetOffsets(path, n+1); err == nil {
		t.Error("TargetOffsets past n: no error")
	}
	if _, err := Target(0); err == nil {
		t.Error("Target(0): no error")
	}
	if _, err := Target(MaxTargetFuncs + 1); err == nil {
		t.Error("Target(MaxTargetFuncs+1): no error")
	}
}

func TestLoad(t *testing.T) {
	probetest.RequireBPF(t)
	for _, p := range []kernelprobe.Path{kernelprobe.PathUprobeMulti, kernelprobe.PathPerfEvent} {
		c, err := LoadCounter(p)
		if err != nil {
			t.Fatal(err)
		}
		if c.CountEntry == nil || c.RecordReturn == nil || c.Counts == nil || c.PIDCounts == nil || c.OutOfRange == nil {
			t.Errorf("LoadCounter(%v) left fields nil: %+v", p, c)
		}
		if got, err := ReadArray(c.Counts, 4); err != nil || len(got) != 4 || got[0] != 0 {
			t.Errorf("ReadArray: %v, %v", got, err)
		}
		if _, err := ReadArray(c.Counts, MaxSites+1); err == nil {
			t.Error("ReadArray past the end: no error")
		}
		c.Close()
	}
	f, err := kernelprobe.Detect()
	if err != nil {
		t.Fatal(err)
	}
	s, err := LoadSession()
	if f.UprobeSession != (err == nil) {
		t.Errorf("LoadSession on a kernel with sessions %v: %v", f.UprobeSession, err)
	}
	if err == nil {
		s.Close()
	}
}

// TestGenerateReproducible runs the //go:generate lines of gen.go into a
// temporary directory and compares the output with the committed files.
func TestGenerateReproducible(t *testing.T) {
	if testing.Short() {
		t.Skip("runs clang")
	}
	_, err := exec.LookPath("clang-19")
	testutil.RequireTool(t, "clang-19", err)
	src, err := os.ReadFile("gen.go")
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	const prefix = "//go:generate go tool bpf2go "
	n := 0
	for line := range strings.Lines(string(src)) {
		args, ok := strings.CutPrefix(strings.TrimSpace(line), prefix)
		if !ok {
			continue
		}
		n++
		cmd := exec.Command("go", append([]string{"tool", "bpf2go", "-output-dir", out}, splitQuoted(args)...)...)
		cmd.Env = append(os.Environ(), "GOPACKAGE=testprogs", "GOFILE=gen.go")
		if msg, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("bpf2go %s: %v\n%s", args, err, msg)
		}
	}
	if n == 0 {
		t.Fatal("no bpf2go lines in gen.go")
	}
	made, err := os.ReadDir(out)
	if err != nil || len(made) == 0 {
		t.Fatalf("bpf2go made %d files: %v", len(made), err)
	}
	committedFiles, _ := filepath.Glob("*_bpfe[lb].*")
	if len(committedFiles) != len(made) {
		t.Errorf("bpf2go made %d files, the package has %d (%v)", len(made), len(committedFiles), committedFiles)
	}
	for _, e := range made {
		fresh, err := os.ReadFile(filepath.Join(out, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		committed, err := os.ReadFile(e.Name())
		if err != nil {
			t.Errorf("%s: generated but not in the package: %v", e.Name(), err)
			continue
		}
		if !bytes.Equal(fresh, committed) {
			t.Errorf("%s: go generate gives sha256 %x, the committed file has %x: rerun go generate ./testprogs",
				e.Name(), sha256.Sum256(fresh), sha256.Sum256(committed))
		}
	}
}

// splitQuoted splits a go:generate argument list at spaces outside double
// quotes, as go generate does.
func splitQuoted(s string) []string {
	var out []string
	var cur strings.Builder
	quoted, have := false, false
	for _, r := range s {
		switch {
		case r == '"':
			quoted, have = !quoted, true
		case r == ' ' && !quoted:
			if have {
				out = append(out, cur.String())
				cur.Reset()
				have = false
			}
		default:
			cur.WriteRune(r)
			have = true
		}
	}
	if have {
		out = append(out, cur.String())
	}
	return out
}
