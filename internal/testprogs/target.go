package testprogs

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/probetest"
	"golang.org/x/sync/errgroup"
)

// MaxTargetFuncs is the largest number of functions [Target] generates.
const MaxTargetFuncs = 100_000

// The generated C is split into translation units of this many functions so
// that gcc can compile them in parallel and none of them is huge.
const funcsPerUnit = 2500

// aliasEvery says which functions get an alias: those whose index is a
// multiple of it.
const aliasEvery = 10

// gccFlags are the compiler flags of every translation unit. -O0 compiles
// about three times faster than -O1 (the 100,000-function target builds in
// ~12 s on two cores); noipa on each function (below) is what keeps the
// functions distinct and called at any optimisation level.
var gccFlags = []string{"-O0", "-g0", "-std=gnu11", "-Wall", "-Werror"}

// FuncName returns the name of function i of a generated target.
func FuncName(i int) string { return fmt.Sprintf("func_%05d", i) }

// HasAlias reports whether function i of a generated target has a second
// name, [AliasName](i), at the same address.
func HasAlias(i int) bool { return i%aliasEvery == 0 }

// AliasName returns the alias of function i; it exists only where
// [HasAlias](i) is true.
func AliasName(i int) string { return fmt.Sprintf("alias_%05d", i) }

// ExpectedCalls returns how many times `target CALLS` (or `target CALLS
// FIRST END`, for FIRST <= i < END) calls function i:
// calls + i%3, so that neighbouring sites have different counts and a
// cookie that points at the wrong counter shows.
func ExpectedCalls(i, calls int) int { return calls + i%3 }

// ExpectedReturn returns what function i returns for argument arg. The
// target calls function i with the arguments 0, 1, … ExpectedCalls(i)-1 in
// that order, so the last return value is ExpectedReturn(i,
// uint64(ExpectedCalls(i, calls)-1)).
func ExpectedReturn(i int, arg uint64) uint64 { return arg*2 + uint64(i) }

// ExpectedSum returns the sum of all return values, which the target prints
// as "done SUM" when it exits.
func ExpectedSum(n, calls int) uint64 { return ExpectedSumRange(0, n, calls) }

// ExpectedSumRange is ExpectedSum for `target CALLS FIRST END`.
func ExpectedSumRange(first, end, calls int) uint64 {
	var sum uint64
	for i := first; i < end; i++ {
		for j := range ExpectedCalls(i, calls) {
			sum += ExpectedReturn(i, uint64(j))
		}
	}
	return sum
}

type buildResult struct {
	once sync.Once
	path string
	err  error
}

var (
	buildsMu sync.Mutex
	builds   = map[int]*buildResult{}
)

// Target returns the path of a target binary with n functions, building it
// with gcc on first use and caching it under the user's cache directory
// (os.UserCacheDir()/multiprobe/testprogs, or $MULTIPROBE_CACHE_DIR if set),
// keyed by n and a hash of the generated sources and compiler flags. Safe for
// concurrent use; within one process each n is built or looked up once.
//
// The binary's command line is
//
//	target [-wait] CALLS
//
// It calls function i [ExpectedCalls](i, CALLS) times, in order of i, then
// prints "done SUM" ([ExpectedSum]) and exits 0. With -wait it first prints
// "ready" and waits for a line (or EOF) on stdin, so a test can attach to the
// running process before any call happens.
func Target(n int) (string, error) {
	if n < 1 || n > MaxTargetFuncs {
		return "", fmt.Errorf("testprogs: target with %d functions: want 1 to %d", n, MaxTargetFuncs)
	}
	buildsMu.Lock()
	r := builds[n]
	if r == nil {
		r = &buildResult{}
		builds[n] = r
	}
	buildsMu.Unlock()
	r.once.Do(func() { r.path, r.err = buildTarget(n) })
	return r.path, r.err
}

// BuildTarget is [Target] for tests: it skips tb (or fails it in CI) when
// gcc is missing and fails it when the build fails.
func BuildTarget(tb testing.TB, n int) string {
	tb.Helper()
	// The cache comes first, so that a machine without gcc (the old-kernel
	// VM) runs with prebuilt targets.
	path, err := Target(n)
	if errors.Is(err, os.ErrNotExist) {
		testutil.RequireTool(tb, "gcc", err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	return path
}

// PrivateTarget is [BuildTarget] followed by a copy of the binary into
// tb.TempDir(). Uprobes belong to the file (its inode), so a test that counts
// events needs a copy of its own: other tests, possibly in other packages
// running at the same time, may run the shared cached binary.
func PrivateTarget(tb testing.TB, n int) string {
	tb.Helper()
	return PrivateCopy(tb, BuildTarget(tb, n))
}

// PrivateCopy copies the executable src into tb.TempDir(), for the same
// reason as [PrivateTarget].
func PrivateCopy(tb testing.TB, src string) string {
	tb.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		tb.Fatal(err)
	}
	dst := filepath.Join(tb.TempDir(), filepath.Base(src))
	if err := os.WriteFile(dst, data, 0o755); err != nil {
		tb.Fatal(err)
	}
	return dst
}

func buildTarget(n int) (string, error) {
	return buildCached(fmt.Sprintf("target-%d", n), generate(n), gccFlags)
}

// buildCached compiles units with flags into an executable "target" in the
// cache directory, under name and a hash of the sources and flags, unless
// it is there already.
func buildCached(name string, units []unit, flags []string) (string, error) {
	dir, err := cached(name, "", units, flags, func(tmp string) error {
		var g errgroup.Group
		g.SetLimit(runtime.NumCPU())
		objs := make([]string, len(units))
		for i, u := range units {
			objs[i] = filepath.Join(tmp, strings.TrimSuffix(u.name, ".c")+".o")
			g.Go(func() error {
				args := append(slices.Clone(flags), "-c", "-o", objs[i], filepath.Join(tmp, u.name))
				return runCC("", args)
			})
		}
		if err := g.Wait(); err != nil {
			return err
		}
		if err := runCC("", append(append(slices.Clone(flags), "-o", filepath.Join(tmp, "target")), objs...)); err != nil {
			return err
		}
		for _, o := range objs {
			os.Remove(o)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "target"), nil
}

// cached returns the cache directory of the build called name of units
// with flags by the compiler cc ("" for the default, see [CCEnv]), running
// build to make it unless it is there already. build runs in a private
// directory holding the units' sources (a unit's name is its file name),
// which is renamed into place, so that test binaries of several packages
// building the same target at once never see a half-written one.
func cached(name, cc string, units []unit, flags []string, build func(dir string) error) (string, error) {
	h := sha256.New()
	if cc != "" {
		fmt.Fprintf(h, "cc %s\n", cc)
	}
	for _, f := range flags {
		fmt.Fprintf(h, "flag %s\n", f)
	}
	for _, u := range units {
		fmt.Fprintf(h, "unit %s %d\n", u.name, len(u.src))
		h.Write(u.src)
	}
	return probetest.Cached("testprogs/"+name, h.Sum(nil), func(dir string) error {
		for _, u := range units {
			if err := os.WriteFile(filepath.Join(dir, u.name), u.src, 0o644); err != nil {
				return fmt.Errorf("testprogs: %w", err)
			}
		}
		return build(dir)
	})
}

// CCEnv and CCFlagsEnv name a compiler, and flags of its own, to build the
// targets with instead of gcc: the VM runner builds a guest's targets for
// another architecture with a cross compiler (aarch64-linux-gnu-gcc, with
// an include directory holding <sys/sdt.h>). Neither is part of a build's
// cache key, so that the guest, which has no compiler, finds what the host
// built under the name it would have built itself.
const (
	CCEnv      = "MULTIPROBE_CC"
	CCFlagsEnv = "MULTIPROBE_CC_FLAGS"
)

// runCC runs the compiler cc, or for "" the one [CCEnv] names (gcc by
// default) with the flags of [CCFlagsEnv].
func runCC(cc string, args []string) error {
	if cc == "" {
		cc = cmp.Or(os.Getenv(CCEnv), "gcc")
		args = append(strings.Fields(os.Getenv(CCFlagsEnv)), args...)
	}
	cmd := exec.Command(cc, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return fmt.Errorf("testprogs: %s: %w", cc, os.ErrNotExist)
		}
		return fmt.Errorf("testprogs: %s %v: %w\n%s", cc, args, err, out.Bytes())
	}
	return nil
}

// A unit is a source file of a build: a C file to compile, or a header.
type unit struct {
	name string // the file name
	src  []byte
}

// generate returns the C translation units of a target with n functions.
func generate(n int) []unit {
	const header = "/* Generated by github.com/multiprobe/multiprobe/testprogs; do not edit. */\n" +
		"typedef unsigned long long u64;\n" +
		// noipa: no inlining, cloning, identical-code folding or
		// interprocedural assumptions, so every function keeps its own
		// address and every call really reaches it.
		"#define FN __attribute__((noipa, used))\n"
	var units []unit
	for lo := 0; lo < n; lo += funcsPerUnit {
		hi := min(lo+funcsPerUnit, n)
		var b bytes.Buffer
		b.WriteString(header)
		for i := lo; i < hi; i++ {
			fmt.Fprintf(&b, "FN u64 %s(u64 x) { return x * 2 + %dULL; }\n", FuncName(i), i)
			if HasAlias(i) {
				fmt.Fprintf(&b, "u64 %s(u64 x) __attribute__((alias(\"%s\")));\n", AliasName(i), FuncName(i))
			}
		}
		units = append(units, unit{name: "funcs_" + strconv.Itoa(lo/funcsPerUnit) + ".c", src: b.Bytes()})
	}

	var b bytes.Buffer
	b.WriteString(header)
	b.WriteString("#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n")
	for i := range n {
		fmt.Fprintf(&b, "u64 %s(u64);\n", FuncName(i))
	}
	fmt.Fprintf(&b, "#define NFUNCS %d\n", n)
	b.WriteString("static u64 (*const funcs[NFUNCS])(u64) = {\n")
	for i := range n {
		fmt.Fprintf(&b, "\t%s,\n", FuncName(i))
	}
	b.WriteString(`};

int main(int argc, char **argv) {
	int wait = 0, a = 1;
	if (argc > 1 && strcmp(argv[1], "-wait") == 0) {
		wait = 1;
		a++;
	}
	if (argc != a + 1 && argc != a + 3) {
		fprintf(stderr, "usage: %s [-wait] CALLS [FIRST END]\n", argv[0]);
		return 2;
	}
	long first = 0, last = NFUNCS;
	if (argc == a + 3) {
		first = strtol(argv[a + 1], NULL, 10);
		last = strtol(argv[a + 2], NULL, 10);
		if (first < 0 || last > NFUNCS || first > last) {
			fprintf(stderr, "%s: bad range %s %s\n", argv[0], argv[a + 1], argv[a + 2]);
			return 2;
		}
	}
	char *end;
	long calls = strtol(argv[a], &end, 10);
	if (*end != '\0' || calls < 0) {
		fprintf(stderr, "%s: bad CALLS %s\n", argv[0], argv[a]);
		return 2;
	}
	if (wait) {
		char line[64];
		printf("ready\n");
		fflush(stdout);
		if (fgets(line, sizeof line, stdin) == NULL && ferror(stdin))
			return 3;
	}
	u64 sum = 0;
	for (long i = first; i < last; i++) {
		long c = calls + i % 3;
		for (long j = 0; j < c; j++)
			sum += funcs[i]((u64)j);
	}
	printf("done %llu\n", sum);
	return 0;
}
`)
	units = append(units, unit{name: "main.c", src: b.Bytes()})
	return units
}
