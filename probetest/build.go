package probetest

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// CacheDirEnv names the environment variable that moves the build cache
// from the user's cache directory (~/.cache/multiprobe).
const CacheDirEnv = "MULTIPROBE_CACHE_DIR"

// cacheRoot is the directory the cache entries live in.
func cacheRoot() (string, error) {
	if d := os.Getenv(CacheDirEnv); d != "" {
		return d, nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", errorf("no cache directory (set %s): %w", CacheDirEnv, err)
	}
	return filepath.Join(d, "multiprobe"), nil
}

// Cached returns the cache directory of the build called name whose inputs
// hash to key (a digest of everything the build depends on), running build
// to make it unless it is there already. build runs in a private,
// initially empty directory, which is then renamed into place, so that
// test binaries of several packages building the same thing at once never
// see half of it. name may contain slashes, as subdirectories of the
// cache (~/.cache/multiprobe, or $MULTIPROBE_CACHE_DIR).
func Cached(name string, key []byte, build func(dir string) error) (string, error) {
	base, err := cacheRoot()
	if err != nil {
		return "", err
	}
	final := filepath.Join(base, name+"-"+hex.EncodeToString(key)[:min(16, 2*len(key))])
	if _, err := os.Stat(final); err == nil {
		return final, nil
	}
	parent := filepath.Dir(final)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return "", errorf("%w", err)
	}
	tmp, err := os.MkdirTemp(parent, "build-")
	if err != nil {
		return "", errorf("%w", err)
	}
	defer os.RemoveAll(tmp)
	if err := build(tmp); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, final); err != nil {
		// Another process won the race: its build is as good as ours.
		if _, statErr := os.Stat(final); statErr == nil {
			return final, nil
		}
		return "", errorf("%w", err)
	}
	return final, nil
}

// A CBuild is a C program for a test to probe: its sources and how to
// compile them.
type CBuild struct {
	// Name names the program and its cache entry.
	Name string
	// Sources are its files by name: every ".c" file is compiled, the
	// others (headers) lie beside them.
	Sources map[string][]byte
	// Flags go to every compiler run, such as -O1 or -pthread.
	Flags []string
	// CC is the compiler: by default $CC, else gcc.
	CC string
}

// Build compiles the program, or finds it in the cache, where a build of
// the same sources, flags and compiler left it, and returns the
// executable's path. A missing compiler is an error wrapping
// exec.ErrNotFound, when the cache has no build: cmd/vmrun copies the
// host's cache into its guests, which have no compiler.
func (b CBuild) Build() (string, error) {
	if b.Name == "" || strings.ContainsAny(b.Name, `/\`) {
		return "", errorf("CBuild %q: want a name without slashes", b.Name)
	}
	cc := cmp.Or(b.CC, os.Getenv("CC"), "gcc")
	names := make([]string, 0, len(b.Sources))
	for name := range b.Sources {
		names = append(names, name)
	}
	slices.Sort(names)
	h := sha256.New()
	fmt.Fprintf(h, "cc %s\n", cc)
	for _, f := range b.Flags {
		fmt.Fprintf(h, "flag %s\n", f)
	}
	var cfiles []string
	for _, name := range names {
		fmt.Fprintf(h, "file %s %d\n", name, len(b.Sources[name]))
		h.Write(b.Sources[name])
		if strings.HasSuffix(name, ".c") {
			cfiles = append(cfiles, name)
		}
	}
	if len(cfiles) == 0 {
		return "", errorf("CBuild %s: no .c file among the sources", b.Name)
	}
	// The compiler is looked for only when the cache has no build: a
	// machine without one (a test VM) runs what the host built.
	dir, err := Cached("probetest/"+b.Name, h.Sum(nil), func(dir string) error {
		if _, err := exec.LookPath(cc); err != nil {
			return errorf("building %s: compiler %s: %w", b.Name, cc, exec.ErrNotFound)
		}
		for _, name := range names {
			if err := os.WriteFile(filepath.Join(dir, name), b.Sources[name], 0o644); err != nil {
				return errorf("%w", err)
			}
		}
		args := append(slices.Clone(b.Flags), "-o", b.Name)
		cmd := exec.Command(cc, append(args, cfiles...)...)
		cmd.Dir = dir
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			return errorf("building %s: %s %s: %w\n%s", b.Name, cc, strings.Join(cmd.Args[1:], " "), err, out.Bytes())
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, b.Name), nil
}

// BuildC is [CBuild.Build] for a test: without a compiler it skips tb
// (fails it under CI=true), and a failed build fails it.
func BuildC(tb testing.TB, b CBuild) string {
	tb.Helper()
	path, err := b.Build()
	if errors.Is(err, exec.ErrNotFound) {
		Unavailable(tb, "%v: install gcc, or set CC", err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	return path
}
