package multiprobe_test

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/probetest"
	"github.com/multiprobe/multiprobe/usdt"
)

// combinationPaths returns the attach paths this kernel can run: its own,
// and every one reached by turning features off (uprobe_multi off gives
// the perf-event path, cookies off the per-site clones).
func combinationPaths(t *testing.T) map[string]kernelprobe.Features {
	t.Helper()
	probetest.RequireBPF(t)
	native, err := kernelprobe.Detect()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]kernelprobe.Features{}
	add := func(f kernelprobe.Features) {
		name := f.Path().String()
		if !f.Cookies {
			name += "-nocookie"
		}
		out[name] = f
	}
	add(native)
	perf := native
	perf.UprobeMulti, perf.UprobeMultiPIDFilter, perf.UprobeSession = false, false, false
	add(perf)
	noCookie := perf
	noCookie.Cookies = false
	add(noCookie)
	return out
}

// startUSDT starts the USDT target with -wait: it makes its n rounds of
// calls when it is told to go.
func startUSDT(t *testing.T, target string, n int) *testprogs.Proc {
	t.Helper()
	return testprogs.Start(t, target, "-wait", fmt.Sprint(n))
}

// TestCombinations attaches entry, return and USDT probes, the same
// function's entry and return among them, and a function's entry and return
// at the offset of the USDT probe it fires (which must share the probe's
// semaphore), in one attach, on every attach
// path this kernel has (uprobe_multi, per-site perf events with cookies,
// and without cookies), filtering by no pid, one pid and a pid set. Three
// processes run the target; per site, the hits and the USDT arguments that
// the BPF side read must be exactly those of the processes admitted.
func TestCombinations(t *testing.T) {
	const n = 30
	for name, f := range combinationPaths(t) {
		for _, mode := range []string{"all", "pid", "pids"} {
			t.Run(name+"/"+mode, func(t *testing.T) {
				testCombination(t, f, mode, n)
			})
		}
	}
}

func testCombination(t *testing.T, f kernelprobe.Features, mode string, n int) {
	target := testprogs.PrivateCopy(t, testprogs.USDTTarget(t))
	procs := []*testprogs.Proc{startUSDT(t, target, n), startUSDT(t, target, n), startUSDT(t, target, n)}
	opts := multiprobe.Options{Features: &f}
	admitted := 3
	switch mode {
	case "pid":
		opts.PID, admitted = procs[0].PID(), 1
	case "pids":
		opts.PIDs, admitted = []int{procs[0].PID(), procs[1].PID()}, 2
	}
	specs := []string{
		"uprobe:" + target + ":report",
		"uretprobe:" + target + ":report",
		"usdt:" + target + ":mp:tick",
		"usdt:" + target + ":mp:guarded",
		"uprobe:" + target + ":named",
		"uretprobe:" + target + ":named",
		"usdt:" + target + ":mp:named",
	}
	inlined := f.Path() == kernelprobe.PathUprobeMulti // 50 more sites: slow per site
	if inlined {
		specs = append(specs, "usdt:"+target+":mp:inlined")
	}
	pl, err := multiprobe.Resolve(mustParse(t, specs...), &opts)
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Close()
	spec, err := testprogs.USDTCounterSpec()
	if err != nil {
		t.Fatal(err)
	}
	if err := pl.Prepare(spec); err != nil {
		t.Fatal(err)
	}
	c, err := testprogs.NewUSDTCounter(spec)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	before := probetest.TakeSnapshot(t, c.CountUSDT)
	l, err := pl.Attach(c.CountUSDT)
	if err != nil {
		t.Fatal(err)
	}
	checkPath(t, l, f)
	wantClones := 0 // the program as loaded
	switch {
	case !f.Cookies:
		wantClones = pl.Len() // one per site, each with its cookie
	case mode == "pids" || (mode == "pid" && !(f.Path() == kernelprobe.PathUprobeMulti && f.UprobeMultiPIDFilter)):
		wantClones = 1 // the link's own filtered copy
	}
	if now, _ := testutil.OpenFDs(); now-before.FDs != l.NumFDs() {
		t.Errorf("%d more file descriptors open while attached, Link.NumFDs says %d", now-before.FDs, l.NumFDs())
	}
	if l.NumClones() != wantClones {
		t.Errorf("%d copies of the program, want %d", l.NumClones(), wantClones)
	}
	for i, p := range procs {
		got := p.Finish(t)
		want := fmt.Sprintf("done %d", n)
		if i < admitted && got != want {
			t.Errorf("process %d said %q, want %q: the guarded probe's semaphore was not set while attached", i, got, want)
		}
	}

	sites := l.Sites()
	wantSites := 7
	if inlined {
		wantSites += testprogs.USDTInlinedSites
	}
	if len(sites) != wantSites {
		t.Fatalf("%d sites, want %d", len(sites), wantSites)
	}
	hits, _ := testprogs.ReadInt64s(c.Hits, len(sites))
	argc, _ := testprogs.ReadInt64s(c.Argc, len(sites))
	sum0, _ := testprogs.ReadInt64s(c.Sum0, len(sites))
	sum1, err := testprogs.ReadInt64s(c.Sum1, len(sites))
	if err != nil {
		t.Fatal(err)
	}
	k := int64(admitted)
	sumI := int64(n * (n - 1) / 2)
	for i, s := range sites {
		if s.Cookie != uint64(i) {
			t.Errorf("%s %s: cookie %d at index %d", s.Probe.Kind, s.Name, s.Cookie, i)
		}
		var want [4]int64 // hits, argc, sum0, sum1
		// mp_usdt_arg_cnt is -ESRCH at a site that is not a USDT probe's.
		const noSpec = -3
		switch s.Name {
		case "report":
			want = [4]int64{k, k * noSpec, 0, 0}
		case "named":
			want = [4]int64{k * int64(n), k * int64(n) * noSpec, 0, 0}
		case "mp:named":
			// arg1 is a pointer, which ASLR moves from process to process.
			want = [4]int64{k * int64(n), k * 2 * int64(n), k * sumI, sum1[i]}
		case "mp:tick":
			want = [4]int64{k * int64(n), k * 2 * int64(n), k * sumI, k * -3 * sumI}
		case "mp:guarded":
			want = [4]int64{k * int64(n), k * int64(n), k * sumI, 0}
		case "mp:inlined":
			want = [4]int64{k, k, k * int64(n), 0}
		default:
			t.Fatalf("unexpected site %s", s.Name)
		}
		if got := [4]int64{hits[i], argc[i], sum0[i], sum1[i]}; got != want {
			t.Errorf("%s %s at %#x (cookie %d): hits, argc, sum0, sum1 = %v, want %v", s.Probe.Kind, s.Name, s.Offset, i, got, want)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	before.CheckLinks(t, "after Close")
	if n := l.NumFDs(); n != 0 {
		t.Errorf("%d fds held after Close", n)
	}
	if held := heldSpecs(t, c.Specs); held != 0 {
		t.Errorf("%d USDT spec ids still held after Close", held)
	}
}

// heldSpecs counts the entries of a USDT spec map that someone holds (the
// refs word of struct mp_usdt_spec).
func heldSpecs(t *testing.T, m *ebpf.Map) int {
	t.Helper()
	var (
		key uint32
		val = make([]byte, usdt.SpecSize)
		n   int
	)
	it := m.Iterate()
	for it.Next(&key, val) {
		if binary.NativeEndian.Uint32(val[usdt.SpecSize-4:]) != 0 {
			n++
		}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}
