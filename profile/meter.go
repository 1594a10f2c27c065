package profile

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"github.com/multiprobe/multiprobe/internal/bpfsys"
	"golang.org/x/sys/unix"
)

// ErrNoBTF is returned for a program the kernel has no BTF for: fentry
// and fexit attach to a program's function by its BTF name.
var ErrNoBTF = errors.New("program has no BTF function info")

// slots is the histogram's size; runcost.c's SLOTS.
const slots = 256

// Meter measures the runs of one program between NewMeter and Close.
type Meter struct {
	name   string
	objs   meterObjects
	links  []link.Link
	events []int // perf event fds, -1 where not opened
}

// meterObjects is what a Meter loads of the runcost object: all of it
// but the empty program.
type meterObjects struct {
	runcostMaps
	Entry *ebpf.Program `ebpf:"runcost_entry"`
	Exit  *ebpf.Program `ebpf:"runcost_exit"`
}

// Close closes what was loaded; a nil program (a load that failed
// half-way) closes as nothing.
func (o *meterObjects) Close() error {
	return errors.Join(o.Entry.Close(), o.Exit.Close(), o.runcostMaps.Close())
}

// NewMeter attaches a meter to prog. prog stays the caller's; the meter
// holds its own reference for as long as it is attached.
func NewMeter(prog *ebpf.Program) (*Meter, error) {
	info, err := prog.Info()
	if err != nil {
		return nil, fmt.Errorf("profile: program info: %w", err)
	}
	fn, err := mainFunc(info)
	if err != nil {
		return nil, fmt.Errorf("profile: program %q: %w", info.Name, err)
	}
	if err := features.HaveProgramType(ebpf.Tracing); err != nil {
		return nil, fmt.Errorf("profile: this kernel loads no fentry/fexit programs: %w", err)
	}
	spec, err := loadRuncost()
	if err != nil {
		return nil, fmt.Errorf("profile: %w", err)
	}
	for _, name := range []string{"runcost_entry", "runcost_exit"} {
		spec.Programs[name].AttachTarget = prog
		spec.Programs[name].AttachTo = fn
	}
	m := &Meter{name: fn}
	if err := spec.LoadAndAssign(&m.objs, nil); err != nil {
		return nil, fmt.Errorf("profile: loading the meter for %s: %w", fn, err)
	}
	if err := m.openCounters(); err != nil {
		m.Close()
		return nil, err
	}
	// fexit first: attached to a program that is running, an fentry
	// alone would count runs into depth that no fexit counts out, and
	// every later run on that CPU would read as nested. An fexit alone
	// meets depth 0 and does nothing. Close detaches in the reverse order.
	for _, p := range []*ebpf.Program{m.objs.Exit, m.objs.Entry} {
		l, err := link.AttachTracing(link.TracingOptions{Program: p})
		if err != nil {
			m.Close()
			return nil, fmt.Errorf("profile: attaching to %s: %w", fn, err)
		}
		m.links = append(m.links, l)
	}
	return m, nil
}

// mainFunc names the function at the start of the program, which fentry
// and fexit attach to.
func mainFunc(info *ebpf.ProgramInfo) (string, error) {
	funcs, err := info.FuncInfos()
	if err != nil || len(funcs) == 0 || funcs[0].Func == nil {
		return "", fmt.Errorf("%w (load it from an object compiled with -g)", ErrNoBTF)
	}
	return funcs[0].Func.Name, nil
}

// Close detaches the meter and releases what it holds.
func (m *Meter) Close() error {
	var errs []error
	for i := len(m.links) - 1; i >= 0; i-- {
		errs = append(errs, m.links[i].Close())
	}
	m.links = nil
	errs = append(errs, m.objs.Close())
	for _, fd := range m.events {
		errs = append(errs, unix.Close(fd))
	}
	m.events = nil
	return errors.Join(errs...)
}

// Function names the function the meter is attached to.
func (m *Meter) Function() string { return m.name }

// Read returns what the meter measured since it was attached.
func (m *Meter) Read() (Cost, error) {
	var c Cost
	var t []runcostTotals
	if err := m.objs.Totals.Lookup(uint32(0), &t); err != nil {
		return c, fmt.Errorf("profile: reading totals: %w", err)
	}
	var cycleRuns, insnRuns uint64
	for _, v := range t {
		c.Runs += v.Runs
		c.Total += time.Duration(v.Ns)
		c.Nested += v.Nested
		c.Cycles.Total += v.Cycles
		cycleRuns += v.CycleRuns
		c.Instructions.Total += v.Insns
		insnRuns += v.InsnRuns
	}
	c.Cycles.Runs, c.Instructions.Runs = cycleRuns, insnRuns
	c.Histogram = make([]uint64, slots)
	var per []uint64
	for k := range uint32(slots) {
		if err := m.objs.Hist.Lookup(k, &per); err != nil {
			return c, fmt.Errorf("profile: reading the histogram: %w", err)
		}
		for _, n := range per {
			c.Histogram[k] += n
		}
	}
	return c, nil
}

// Cost is what a Meter measured over a number of runs.
type Cost struct {
	// Runs is how many runs were timed.
	Runs uint64
	// Total is their time, from fentry's clock reading to fexit's.
	Total time.Duration
	// Nested counts runs that started on a CPU whose previous run had not
	// ended (a preempted uprobe program); they are in the outer run's time.
	Nested uint64
	// Cycles and Instructions are the hardware counters over the runs.
	Cycles, Instructions Counter
	// Histogram counts runs by duration: see SlotRange.
	Histogram []uint64
}

// Counter is a hardware counter summed over the runs it was read for.
type Counter struct {
	Total uint64
	// Runs is how many runs the counter was read at both ends of: 0 where
	// the machine has no such counter (a VM without a PMU), which is not
	// a count of 0.
	Runs uint64
}

// Present reports whether the counter was read at all.
func (c Counter) Present() bool { return c.Runs > 0 }

// PerRun is the counter's mean per run it was read for, NaN if it was
// never read.
func (c Counter) PerRun() float64 {
	if c.Runs == 0 {
		return math.NaN()
	}
	return float64(c.Total) / float64(c.Runs)
}

// Mean is the mean time per run.
func (c Cost) Mean() time.Duration {
	if c.Runs == 0 {
		return 0
	}
	return c.Total / time.Duration(c.Runs)
}

// Sub returns what was measured between prev, an earlier Read of the same
// meter, and c.
func (c Cost) Sub(prev Cost) Cost {
	d := Cost{
		Runs:         c.Runs - prev.Runs,
		Total:        c.Total - prev.Total,
		Nested:       c.Nested - prev.Nested,
		Cycles:       Counter{c.Cycles.Total - prev.Cycles.Total, c.Cycles.Runs - prev.Cycles.Runs},
		Instructions: Counter{c.Instructions.Total - prev.Instructions.Total, c.Instructions.Runs - prev.Instructions.Runs},
		Histogram:    make([]uint64, len(c.Histogram)),
	}
	for i := range d.Histogram {
		d.Histogram[i] = c.Histogram[i]
		if i < len(prev.Histogram) {
			d.Histogram[i] -= prev.Histogram[i]
		}
	}
	return d
}

// SlotRange returns the durations slot i of the histogram counts, [lo, hi)
// in nanoseconds: four slots per power of two from 8 ns, the first eight
// one nanosecond each.
func SlotRange(i int) (lo, hi uint64) {
	if i < 8 {
		return uint64(i), uint64(i) + 1
	}
	l, s := uint(i/4), uint64(i%4)
	if l < 3 {
		return 8, 8 // slots 8..11 are never used
	}
	step := uint64(1) << (l - 2)
	lo = uint64(1)<<l + s*step
	return lo, lo + step
}

// Percentile returns the duration below which a fraction p (0 to 1) of the
// runs fall, interpolated within its histogram slot, so off by at most a
// quarter of the slot's lower bound.
func (c Cost) Percentile(p float64) time.Duration {
	var n uint64
	for _, v := range c.Histogram {
		n += v
	}
	if n == 0 || math.IsNaN(p) {
		return 0
	}
	p = min(max(p, 0), 1)
	rank := p * float64(n)
	var below uint64
	for i, v := range c.Histogram {
		if v == 0 {
			continue
		}
		if float64(below+v) >= rank {
			lo, hi := SlotRange(i)
			f := (rank - float64(below)) / float64(v)
			return time.Duration(float64(lo) + f*float64(hi-lo))
		}
		below += v
	}
	lo, _ := SlotRange(len(c.Histogram) - 1)
	return time.Duration(lo)
}

// Overhead is what a Meter adds, measured on an empty program.
type Overhead struct {
	// Reading is the meter's own part of every time it reads: what it
	// reads for a run of a program that does nothing. Subtract it from
	// a Cost's mean or percentiles for the program's own time.
	Reading time.Duration
	// PerRun is what every run of a measured program costs more while a
	// Meter is attached, by the kernel's own accounting
	// (bpf_stats_enabled): Reading and the fentry and fexit programs.
	PerRun time.Duration
}

var overhead struct {
	once sync.Once
	o    Overhead
	err  error
}

// MeasureOverhead returns the Meter's overhead, measured on the first call
// over 100,000 runs of an empty program (BPF_PROG_TEST_RUN) with and
// without a meter, and kept.
func MeasureOverhead() (Overhead, error) {
	overhead.once.Do(func() { overhead.o, overhead.err = measureOverhead() })
	return overhead.o, overhead.err
}

func measureOverhead() (Overhead, error) {
	const runs = 100_000
	var o Overhead
	spec, err := loadRuncost()
	if err != nil {
		return o, fmt.Errorf("profile: %w", err)
	}
	empty, err := ebpf.NewProgram(spec.Programs["runcost_empty"])
	if err != nil {
		return o, fmt.Errorf("profile: loading the empty program: %w", err)
	}
	defer empty.Close()
	stats, err := ebpf.EnableStats(bpfsys.StatsRunTime)
	if err != nil {
		return o, fmt.Errorf("profile: enabling BPF run-time statistics: %w", err)
	}
	defer stats.Close()
	// kernelMean runs the empty program and returns the kernel's mean
	// time per run.
	kernelMean := func() (time.Duration, error) {
		before, err := empty.Stats()
		if err != nil {
			return 0, err
		}
		if _, err := empty.Run(&ebpf.RunOptions{Data: make([]byte, 64), Repeat: runs}); err != nil {
			return 0, fmt.Errorf("profile: running the empty program: %w", err)
		}
		after, err := empty.Stats()
		if err != nil {
			return 0, err
		}
		if after.RunCount == before.RunCount {
			return 0, errors.New("profile: the kernel counted no run of the empty program")
		}
		return (after.Runtime - before.Runtime) / time.Duration(after.RunCount-before.RunCount), nil
	}
	bare, err := kernelMean()
	if err != nil {
		return o, err
	}
	m, err := NewMeter(empty)
	if err != nil {
		return o, err
	}
	defer m.Close()
	metered, err := kernelMean()
	if err != nil {
		return o, err
	}
	c, err := m.Read()
	if err != nil {
		return o, err
	}
	if c.Runs == 0 {
		return o, errors.New("profile: the meter saw no run of the empty program")
	}
	o.Reading = c.Mean()
	o.PerRun = max(metered-bare, 0)
	return o, nil
}
