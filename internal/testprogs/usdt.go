package testprogs

import (
	_ "embed"
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/multiprobe/multiprobe/internal/testutil"
)

//go:embed c/usdt_target.c
var usdtTargetSource []byte

//go:embed c/sema.c
var semaSource []byte

// SemaTarget returns the path of the semaphore target (c/sema.c), built
// as a PIE or not, on first use and cached like [Target]. It is driven over
// stdin: see the comment at the top of c/sema.c.
func SemaTarget(tb testing.TB, pie bool) string {
	tb.Helper()
	path, err := BuildSemaTarget(pie)
	if errors.Is(err, os.ErrNotExist) {
		testutil.RequireTool(tb, "gcc", err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	return path
}

// BuildSemaTarget is SemaTarget outside a test.
func BuildSemaTarget(pie bool) (string, error) {
	if pie {
		return buildCached("sema-pie", []unit{{name: "sema.c", src: semaSource}}, []string{"-O1", "-fPIE", "-pie"})
	}
	return buildCached("sema-nopie", []unit{{name: "sema.c", src: semaSource}}, []string{"-O1", "-fno-PIE", "-no-pie"})
}

// USDTInlinedSites is how many sites the mp:inlined probe of the USDT
// target has.
const USDTInlinedSites = 50

// USDTTarget returns the path of the USDT target (c/usdt_target.c), built
// with gcc -O2 on first use and cached like [Target]. It needs
// <sys/sdt.h> (Debian's systemtap-sdt-dev). Its command line is
//
//	usdt_target [-wait] N
//
// It fires mp:tick(i, -3*i) for i from 0 to N-1, mp:guarded(i) as often
// but only while the probe's semaphore is set, mp:inlined(N) once at each
// of its USDTInlinedSites sites, then prints "done G" with how often
// mp:guarded fired.
func USDTTarget(tb testing.TB) string {
	tb.Helper()
	path, err := BuildUSDTTarget()
	if errors.Is(err, os.ErrNotExist) {
		testutil.RequireTool(tb, "gcc", err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	return path
}

// BuildUSDTTarget is USDTTarget outside a test: it returns the cached
// target's path, building it first if needed.
func BuildUSDTTarget() (string, error) {
	return buildCached("usdt", []unit{{name: "usdt_target.c", src: usdtTargetSource}}, []string{"-O2", "-g0", "-Wall", "-Werror"})
}

// USDTCounter holds the loaded USDT counter program (bpf/usdt_counter.c)
// and its maps. The per-site arrays are indexed by the site's index (the
// user's cookie) and hold int64 values.
type USDTCounter struct {
	// CountUSDT adds one to Hits, the argument count to Argc and the
	// first two arguments to Sum0 and Sum1.
	CountUSDT *ebpf.Program

	Hits, Argc, Sum0, Sum1 *ebpf.Map
	// Specs is the spec map of bpf/mp_usdt.bpf.h.
	Specs *ebpf.Map

	objs usdtCounterObjects
}

// USDTCounterSpec returns the USDT counter's collection spec, for a caller
// that prepares it (multiprobe.Plan.Prepare) before NewUSDTCounter loads
// it.
func USDTCounterSpec() (*ebpf.CollectionSpec, error) {
	return loadUsdtCounter()
}

// NewUSDTCounter loads a spec from USDTCounterSpec the way a user of
// bpf2go does: LoadAndAssign into the generated objects struct.
func NewUSDTCounter(spec *ebpf.CollectionSpec) (*USDTCounter, error) {
	c := &USDTCounter{}
	if err := spec.LoadAndAssign(&c.objs, nil); err != nil {
		return nil, fmt.Errorf("testprogs: load USDT counter: %w", err)
	}
	o := &c.objs
	c.CountUSDT, c.Hits, c.Argc, c.Sum0, c.Sum1 = o.CountUsdt, o.UsdtHits, o.UsdtArgc, o.UsdtSum0, o.UsdtSum1
	c.Specs = o.MpUsdtSpecs
	return c, nil
}

// Close releases the program and maps.
func (c *USDTCounter) Close() error {
	return c.objs.Close()
}

// ReadInt64s returns entries 0 to n-1 of an array map of int64 values.
func ReadInt64s(m *ebpf.Map, n int) ([]int64, error) {
	out := make([]int64, n)
	for i := range out {
		if err := m.Lookup(uint32(i), &out[i]); err != nil {
			return nil, fmt.Errorf("testprogs: map %s entry %d: %w", m, i, err)
		}
	}
	return out, nil
}

//go:embed c/threads.c
var threadsSource []byte

// ThreadsTarget returns the path of the multi-threaded target
// (c/threads.c), built on first use and cached like [Target]: with -wait
// it prints "ready", and on a line makes its calls of mt_func from the
// given number of threads. The pid filter's tests use it, since a
// process's pid must admit every one of its threads.
func ThreadsTarget(tb testing.TB) string {
	tb.Helper()
	path, err := BuildThreadsTarget()
	if errors.Is(err, os.ErrNotExist) {
		testutil.RequireTool(tb, "gcc", err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	return path
}

// BuildThreadsTarget is ThreadsTarget outside a test.
func BuildThreadsTarget() (string, error) {
	return buildCached("threads", []unit{{name: "threads.c", src: threadsSource}}, []string{"-O1", "-pthread"})
}

//go:embed c/ifunc_target.c
var ifuncSource []byte

// IFuncTarget returns the path of the IFUNC target (c/ifunc_target.c),
// built on first use and cached like [Target]. -fno-builtin keeps gcc from
// open-coding the calls, so that each goes through the PLT to glibc.
func IFuncTarget(tb testing.TB) string {
	tb.Helper()
	path, err := BuildIFuncTarget()
	if errors.Is(err, os.ErrNotExist) {
		testutil.RequireTool(tb, "gcc", err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	return path
}

// BuildIFuncTarget is IFuncTarget outside a test.
func BuildIFuncTarget() (string, error) {
	return buildCached("ifunc", []unit{{name: "ifunc_target.c", src: ifuncSource}}, []string{"-O1", "-fno-builtin"})
}

//go:embed c/sleeper.c
var sleeperSource []byte

// SleeperTarget returns the path of the latency target (c/sleeper.c),
// built on first use and cached like [Target]: `sleeper N` calls each of
// its functions, which take known times, N times.
func SleeperTarget(tb testing.TB) string {
	tb.Helper()
	path, err := BuildSleeperTarget()
	if errors.Is(err, os.ErrNotExist) {
		testutil.RequireTool(tb, "gcc", err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	return path
}

// BuildSleeperTarget is SleeperTarget outside a test.
func BuildSleeperTarget() (string, error) {
	return buildCached("sleeper", []unit{{name: "sleeper.c", src: sleeperSource}}, []string{"-O1"})
}

//go:embed c/mallocs.c
var mallocsSource []byte

// MallocsTarget returns the path of a container's workload for the
// watch's tests (c/mallocs.c), built on first use and cached like
// [Target]: `mallocs N US` calls malloc N times, one every US
// microseconds from its start, and nothing else calls malloc; it prints
// "calls N first NS", NS the first call's CLOCK_MONOTONIC time.
func MallocsTarget(tb testing.TB) string {
	tb.Helper()
	path, err := BuildMallocsTarget()
	if errors.Is(err, os.ErrNotExist) {
		testutil.RequireTool(tb, "gcc", err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	return path
}

// BuildMallocsTarget is MallocsTarget outside a test.
func BuildMallocsTarget() (string, error) {
	return buildCached("mallocs", []unit{{name: "mallocs.c", src: mallocsSource}}, []string{"-O1", "-fno-builtin"})
}
