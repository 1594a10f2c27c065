package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/multiprobe/multiprobe/internal/testprogs"
)

func main() {
	out := flag.String("o", "", "`DIR` to use as the guest's MULTIPROBE_CACHE_DIR (required)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: vmtest -o DIR N...\n\n"+
			"Copies the testprogs targets with N functions, and the fixed targets and\n"+
			"fixtures, into DIR, building them with gcc if needed.\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	sizes, err := parseSizes(flag.Args())
	if err != nil || *out == "" {
		if err == nil {
			err = errors.New("-o DIR is required")
		}
		fmt.Fprintln(os.Stderr, "vmtest:", err)
		flag.Usage()
		os.Exit(2)
	}
	if err := prebuild(*out, sizes); err != nil {
		fmt.Fprintln(os.Stderr, "vmtest:", err)
		os.Exit(1)
	}
}

// parseSizes parses the function counts; at least one is required.
func parseSizes(args []string) ([]int, error) {
	if len(args) == 0 {
		return nil, errors.New("no target sizes given")
	}
	sizes := make([]int, 0, len(args))
	for _, a := range args {
		n, err := strconv.Atoi(a)
		if err != nil || n < 1 || n > testprogs.MaxTargetFuncs {
			return nil, fmt.Errorf("target size %q: want a number from 1 to %d", a, testprogs.MaxTargetFuncs)
		}
		sizes = append(sizes, n)
	}
	return sizes, nil
}

// hostCache returns the directory that, as MULTIPROBE_CACHE_DIR, makes
// testprogs use the host's usual cache: the variable's value if set, else
// the default location (os.UserCacheDir()/multiprobe).
func hostCache() (string, error) {
	if d := os.Getenv("MULTIPROBE_CACHE_DIR"); d != "" {
		return filepath.Abs(d)
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no cache directory (set MULTIPROBE_CACHE_DIR): %w", err)
	}
	return filepath.Join(d, "multiprobe"), nil
}

// prebuild copies the targets of the given sizes from the host's cache,
// building them there first if needed, to the same relative paths under dst.
func prebuild(dst string, sizes []int) error {
	base, err := hostCache()
	if err != nil {
		return err
	}
	// Target places its builds under MULTIPROBE_CACHE_DIR; pinning the
	// variable to base is what makes each path's place relative to base
	// the place the guest looks at relative to dst.
	if err := os.Setenv("MULTIPROBE_CACHE_DIR", base); err != nil {
		return err
	}
	one := func(build func() (string, error)) func() ([]string, error) {
		return func() ([]string, error) {
			p, err := build()
			return []string{p}, err
		}
	}
	builds := []func() ([]string, error){
		one(testprogs.BuildUSDTTarget),
		one(func() (string, error) { return testprogs.BuildSemaTarget(true) }),
		one(func() (string, error) { return testprogs.BuildSemaTarget(false) }),
		one(testprogs.BuildThreadsTarget),
		one(testprogs.BuildIFuncTarget),
		one(testprogs.BuildSleeperTarget),
		one(testprogs.BuildMallocsTarget),
		func() ([]string, error) {
			fx, err := testprogs.BuildUSDTFixtures("")
			return []string{fx.Lib, fx.Exe, fx.ExeO0, fx.ExeNoPIE}, err
		},
		// The Go target, for the guest's GOARCH (this process's
		// environment says which when it is not the host's).
		func() ([]string, error) {
			var out []string
			for _, stripped := range []bool{false, true} {
				p, err := testprogs.BuildGoTarget(os.Getenv("GOARCH"), stripped)
				if err != nil {
					return nil, err
				}
				out = append(out, p)
			}
			return out, nil
		},
	}
	for _, n := range sizes {
		builds = append(builds, one(func() (string, error) { return testprogs.Target(n) }))
	}
	for _, build := range builds {
		srcs, err := build()
		if err != nil {
			return err
		}
		for _, src := range srcs {
			rel, err := filepath.Rel(base, src)
			if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
				return fmt.Errorf("target %s is outside the cache %s", src, base)
			}
			if err := copyFile(filepath.Join(dst, rel), src); err != nil {
				return err
			}
		}
	}
	return nil
}

func copyFile(dst, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copying %s to %s: %w", src, dst, err)
	}
	return out.Close()
}
