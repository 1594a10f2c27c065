package profile

import (
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"

	"github.com/multiprobe/multiprobe/internal/bpfsys"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/probetest"
)

// loadHotProgram loads the test program with its loop set to loops iterations.
func loadHotProgram(t *testing.T, loops uint32) *ebpf.Program {
	t.Helper()
	spec, err := loadHot()
	if err != nil {
		t.Fatal(err)
	}
	if err := spec.Variables["loops"].Set(loops); err != nil {
		t.Fatal(err)
	}
	var objs hotObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { objs.Close() })
	return objs.Hot
}

// runHot runs prog n times by BPF_PROG_TEST_RUN on the hot path.
func runHot(t *testing.T, prog *ebpf.Program, n uint32) {
	t.Helper()
	if _, err := prog.Run(&ebpf.RunOptions{Data: make([]byte, 64), Repeat: n}); err != nil {
		t.Fatal(err)
	}
}

// measure runs a program of loops iterations n times under a meter and
// returns what the meter and the kernel's own statistics saw.
func measure(t *testing.T, loops, n uint32) (Cost, ebpf.ProgramStats) {
	t.Helper()
	prog := loadHotProgram(t, loops)
	probetest.CheckLeaks(t, prog)
	m, err := NewMeter(prog)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.Function() != "hot" {
		t.Errorf("meter attached to %q, want hot", m.Function())
	}
	stats, err := ebpf.EnableStats(bpfsys.StatsRunTime)
	if err != nil {
		t.Fatal(err)
	}
	defer stats.Close()
	before, err := prog.Stats()
	if err != nil {
		t.Fatal(err)
	}
	runHot(t, prog, n)
	after, err := prog.Stats()
	if err != nil {
		t.Fatal(err)
	}
	c, err := m.Read()
	if err != nil {
		t.Fatal(err)
	}
	return c, ebpf.ProgramStats{Runtime: after.Runtime - before.Runtime, RunCount: after.RunCount - before.RunCount}
}

// requireTracing skips t where the kernel loads no tracing programs: the
// 6.18 host these tests run on in CI refuses them (EPERM, as root), so
// the VM guests run them (.ci/oldkernel/run), and fail there.
func requireTracing(t *testing.T) {
	t.Helper()
	probetest.RequireBPF(t)
	if err := features.HaveProgramType(ebpf.Tracing); err != nil {
		if testutil.InGuest() {
			t.Fatal(err)
		}
		t.Skipf("this kernel loads no fentry/fexit programs (%v); the VM guests run this test", err)
	}
}

// TestMeter measures a program whose one hot line is a loop, at two
// lengths: every run is counted, the percentiles are ordered, a loop ten
// times longer moves the median by at least five times, and the mean,
// less the meter's overhead, is within 15% of the kernel's own accounting
// of the same runs, less the same (for the longer loop, where the meter
// adds less than a tenth). The counters are either absent (these VMs have no
// PMU) or count something.
func TestMeter(t *testing.T) {
	requireTracing(t)
	over, err := MeasureOverhead()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("overhead: %v in each reading, %v added to each run", over.Reading, over.PerRun)
	const n = 2000
	var p50s, kernels []time.Duration
	for _, loops := range []uint32{2000, 20000} {
		c, st := measure(t, loops, n)
		p50, p95, p99 := c.Percentile(0.5), c.Percentile(0.95), c.Percentile(0.99)
		kernel := st.Runtime / time.Duration(st.RunCount)
		kernels = append(kernels, kernel)
		t.Logf("loops %d: %d runs, mean %v, p50 %v, p95 %v, p99 %v, nested %d; kernel: %d runs, mean %v",
			loops, c.Runs, c.Mean(), p50, p95, p99, c.Nested, st.RunCount, kernel)
		if c.Runs+c.Nested != n || st.RunCount != n {
			t.Errorf("loops %d: meter timed %d runs (+%d nested), kernel counted %d; want %d", loops, c.Runs, c.Nested, st.RunCount, n)
		}
		if !(p50 > 0 && p50 <= p95 && p95 <= p99) {
			t.Errorf("loops %d: p50 %v, p95 %v, p99 %v: want 0 < p50 <= p95 <= p99", loops, p50, p95, p99)
		}
		// The kernel's runs include the meter's programs (PerRun), the
		// meter's readings only its own part of them (Reading). Compared
		// where the body dominates: under TCG the meter's programs vary
		// by microseconds from run to run, as much as the short body
		// takes.
		// Under arm64 emulation the meter's programs cost 40 µs a run,
		// give or take 20: there the overhead's own error is more than 15%
		// of the result, and the comparison would test the emulator.
		got, want := c.Mean()-over.Reading, kernel-over.PerRun
		if comparable := 10*over.PerRun < kernel; loops >= 20000 && !comparable {
			t.Logf("loops %d: not compared with the kernel's mean: the meter adds %v of %v", loops, over.PerRun, kernel)
		} else if loops >= 20000 && math.Abs(float64(got-want)) > 0.15*float64(want) {
			t.Errorf("loops %d: mean less overhead %v, kernel's mean less overhead %v: more than 15%% apart", loops, got, want)
		}
		for name, k := range map[string]Counter{"cycles": c.Cycles, "instructions": c.Instructions} {
			if k.Present() && k.Total == 0 {
				t.Errorf("%s read on %d runs but counted 0", name, k.Runs)
			}
			if !k.Present() && !math.IsNaN(k.PerRun()) {
				t.Errorf("%s absent but PerRun %v, want NaN", name, k.PerRun())
			}
		}
		// The program's own median: under arm64 emulation the meter's
		// part of a reading (12 µs) is more than the short loop's.
		p50s = append(p50s, p50-over.Reading)
	}
	// Ten times the loop is at least five times the time on a machine.
	// An emulator can run the longer loop faster an iteration (TCG, 6.1:
	// the kernel's own means moved 4.3 times): then the meter must move
	// as the kernel's accounting did, which the test can still tell
	// from a meter that does not follow the program.
	moved := float64(p50s[1]) / float64(p50s[0])
	kernelMoved := float64(kernels[1]-over.PerRun) / float64(kernels[0]-over.PerRun)
	switch {
	case kernelMoved >= 5 && moved < 5:
		t.Errorf("ten times the loop moved p50 less overhead from %v to %v (%.1f times): want at least five times", p50s[0], p50s[1], moved)
	case kernelMoved < 5 && (moved < 0.7*kernelMoved || moved < 2):
		t.Errorf("ten times the loop moved p50 less overhead %.1f times and the kernel's mean %.1f: want the meter to follow", moved, kernelMoved)
	case kernelMoved < 5:
		t.Logf("ten times the loop moved the kernel's mean only %.1f times (emulation); the meter's p50 moved %.1f times", kernelMoved, moved)
	}
}

// TestMeterWhileRunning attaches a meter to a program that runs all the
// while, on both CPUs, as a probe on a busy service does: every run it
// times is a whole one, none reads as nested (this program does not nest),
// and the runs it saw are fewer than the kernel's, which began first.
func TestMeterWhileRunning(t *testing.T) {
	requireTracing(t)
	testutil.SkipOnMTTCG(t) // it patches the program as it runs
	prog := loadHotProgram(t, 200)
	probetest.CheckLeaks(t, prog)
	stats, err := ebpf.EnableStats(bpfsys.StatsRunTime)
	if err != nil {
		t.Fatal(err)
	}
	defer stats.Close()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				prog.Run(&ebpf.RunOptions{Data: make([]byte, 64), Repeat: 50})
			}
		}()
	}
	defer wg.Wait()
	defer close(stop)
	for i := range 5 { // each attach and detach meets runs under way
		m, err := NewMeter(prog)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
		c, err := m.Read()
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
		if c.Runs == 0 || c.Nested != 0 {
			t.Errorf("attach %d: %d runs timed, %d nested: want some, and none nested", i, c.Runs, c.Nested)
		}
	}
}

// TestNoBTF refuses a program without BTF with ErrNoBTF, and leaves
// nothing behind.
func TestNoBTF(t *testing.T) {
	probetest.RequireBPF(t)
	ps := &ebpf.ProgramSpec{Type: ebpf.SocketFilter, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}}
	prog, err := ebpf.NewProgram(ps)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prog.Close() })
	probetest.CheckLeaks(t, prog)
	if _, err := NewMeter(prog); !errors.Is(err, ErrNoBTF) {
		t.Fatalf("NewMeter of a program without BTF: %v, want ErrNoBTF", err)
	}
}

// TestPercentile checks the histogram's arithmetic without a kernel: slot
// bounds, percentiles interpolated within a slot, and counters that were
// never read.
func TestPercentile(t *testing.T) {
	for _, c := range []struct {
		slot   int
		lo, hi uint64
	}{{0, 0, 1}, {7, 7, 8}, {12, 8, 10}, {15, 14, 16}, {16, 16, 20}, {40, 1024, 1280}, {43, 1792, 2048}} {
		if lo, hi := SlotRange(c.slot); lo != c.lo || hi != c.hi {
			t.Errorf("SlotRange(%d) = [%d, %d), want [%d, %d)", c.slot, lo, hi, c.lo, c.hi)
		}
	}
	h := make([]uint64, slots)
	h[40] = 50 // [1024, 1280)
	h[44] = 50 // [2048, 2560)
	c := Cost{Runs: 100, Total: 100 * 1700, Histogram: h}
	for _, tc := range []struct {
		p    float64
		want time.Duration
	}{{0, 1024}, {0.25, 1152}, {0.5, 1280}, {0.75, 2304}, {1, 2560}} {
		if got := c.Percentile(tc.p); got != tc.want {
			t.Errorf("Percentile(%v) = %v, want %v", tc.p, got, tc.want)
		}
	}
	if c.Mean() != 1700 {
		t.Errorf("Mean = %v, want 1.7µs", c.Mean())
	}
	if (Cost{}).Percentile(0.5) != 0 || (Cost{}).Mean() != 0 {
		t.Error("an empty Cost has a percentile or a mean")
	}
	d := c.Sub(Cost{Runs: 40, Total: 40 * 1024, Histogram: append(make([]uint64, 40), 40)})
	if d.Runs != 60 || d.Histogram[40] != 10 || d.Histogram[44] != 50 {
		t.Errorf("Sub: %d runs, slots %d and %d; want 60, 10, 50", d.Runs, d.Histogram[40], d.Histogram[44])
	}
	k := Counter{Total: 3000, Runs: 1000}
	if !k.Present() || k.PerRun() != 3 {
		t.Errorf("counter read on 1000 runs: present %v, per run %v; want true, 3", k.Present(), k.PerRun())
	}
	if (Counter{}).Present() || !math.IsNaN((Counter{}).PerRun()) {
		t.Error("a counter never read is present or has a number per run")
	}
}
