package testprogs

import (
	"cmp"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/multiprobe/multiprobe/internal/testutil"
)

//go:embed testdata/stackgrow/main.go
var stackgrowSource []byte

// GoTargetFuncs are the functions of the Go target that tests probe, as
// the symbol table names them.
var GoTargetFuncs = []string{"main.Deep", "main.Big", "main.Leaf", "main.Pair"}

// BuildGoTarget builds the Go target (testdata/stackgrow, see its doc)
// for goarch ("" for this machine's), stripped of its symbol table
// (-ldflags=-s, leaving .gopclntab) or not, and caches it like [Target].
// It needs the go command only when the build is not cached.
func BuildGoTarget(goarch string, stripped bool) (string, error) {
	goarch = cmp.Or(goarch, runtime.GOARCH)
	ldflags := ""
	name := "stackgrow-" + goarch
	if stripped {
		ldflags, name = "-s", name+"-stripped"
	}
	units := []unit{
		{name: "main.go", src: stackgrowSource},
		{name: "go.mod", src: []byte("module stackgrow\n\ngo 1.22\n")},
	}
	dir, err := cached(name, "", units, []string{"GOARCH=" + goarch, "ldflags=" + ldflags, runtime.Version()}, func(tmp string) error {
		gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
		if _, err := os.Stat(gobin); err != nil {
			gobin = "go"
		}
		cmd := exec.Command(gobin, "build", "-trimpath", "-ldflags="+ldflags, "-o", "target", ".")
		cmd.Dir = tmp
		cmd.Env = append(os.Environ(), "GOARCH="+goarch, "CGO_ENABLED=0", "GOWORK=off", "GOFLAGS=-mod=mod", "GOTOOLCHAIN=local")
		if out, err := cmd.CombinedOutput(); err != nil {
			if errors.Is(err, exec.ErrNotFound) {
				return fmt.Errorf("testprogs: go: %w", os.ErrNotExist)
			}
			return fmt.Errorf("testprogs: go build stackgrow: %w\n%s", err, out)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "target"), nil
}

// GoTarget is [BuildGoTarget] for tests, for this machine.
func GoTarget(tb testing.TB, stripped bool) string {
	tb.Helper()
	path, err := BuildGoTarget("", stripped)
	if errors.Is(err, os.ErrNotExist) {
		testutil.RequireTool(tb, "go", err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	return path
}
