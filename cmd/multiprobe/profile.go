package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cilium/ebpf"

	"github.com/multiprobe/multiprobe/internal/bpfsys"
	"github.com/multiprobe/multiprobe/profile"
)

func init() {
	commands["profile"] = &command{
		usage:      "[--duration D] [--freq HZ] [--lines N] [--json] [-o FILE.pb.gz] [--folded FILE] PROG",
		short:      "profile a loaded BPF program where it runs: cost per run and hot source lines (root)",
		privileges: "CAP_SYS_ADMIN (to open a program by id), CAP_BPF and CAP_PERFMON",
		long: `PROG is a loaded program's ID, its pinned path, or its name (as bpftool
prog lists it) where one program has it. While the program runs in its
place (its hooks, its traffic), multiprobe times every run with fentry and
fexit programs (percentiles, and cycles and instructions where the machine
has a PMU) and samples all CPUs with the cpu-clock event, keeping the
samples in the program's JIT code, mapped to source lines through its BTF
line info. The lines go out as a table, as a pprof profile (-o; open it with
go tool pprof -http=: FILE) and as folded stacks for other flame-graph tools
(--folded). A program without BTF gets its cost per run and a note why
there are no lines. Ctrl-C ends the profile early; either way nothing stays
attached.`,
		examples: []string{
			"profile --duration 10s 42",
			"profile -o hot.pb.gz /sys/fs/bpf/my_prog",
			"profile --json --freq 4999 --duration 5 my_uprobe",
		},
		run: runProfile,
	}
}

func runProfile(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("profile")
	duration := secondsFlag(10 * time.Second)
	fs.Var(&duration, "duration", "profile for this long: `D` as 10s, 1m30s or 2.5 (seconds)")
	var pf profileFlags
	pf.register(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	rest, command, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(rest) != 1 || command != nil {
		return usagef("want one program: an ID, a pinned path or a name")
	}
	if err := pf.check(); err != nil {
		return err
	}
	if duration <= 0 {
		return usagef("--duration %v: want a positive time", time.Duration(duration))
	}
	if err := bpfsys.RaiseMemlock(); err != nil {
		return err
	}
	prog, err := openProgram(rest[0])
	if err != nil {
		return err
	}
	defer prog.Close()

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	p, err := startProfile(prog, nil, pf.freq)
	if err != nil {
		return err
	}
	defer p.close()
	var progress func(time.Duration)
	if isTerminal(stderr) {
		progress = func(elapsed time.Duration) {
			fmt.Fprintf(stderr, "\rprofiling %s: %v of %v, %d samples in it\x1b[K", p.name, elapsed.Round(time.Second), time.Duration(duration), p.samplesSoFar())
		}
	}
	var sig os.Signal
	deadline := time.After(time.Duration(duration))
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
wait:
	for {
		select {
		case <-deadline:
			break wait
		case sig = <-sigs:
			break wait
		case <-tick.C:
			if progress != nil {
				progress(time.Since(p.start))
			}
		}
	}
	if progress != nil {
		fmt.Fprint(stderr, "\r\x1b[K")
	}
	if sig != nil {
		fmt.Fprintf(stderr, "%v: stopping\n", sig)
	}
	r, err := p.stop()
	if err != nil {
		return err
	}
	if err := pf.write(r); err != nil {
		return err
	}
	if *asJSON {
		err = writeJSON(stdout, r)
	} else {
		r.writeText(stdout, pf.top)
	}
	if err != nil {
		return err
	}
	if sig, ok := sig.(syscall.Signal); ok {
		return &exitStatus{code: 128 + int(sig)}
	}
	return nil
}

// profileFlags are the flags profile and count --profile share.
type profileFlags struct {
	freq   int
	top    int
	pprof  string
	folded string
}

func (f *profileFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&f.freq, "freq", 999, "sample each CPU `HZ` times a second")
	fs.IntVar(&f.top, "lines", 20, "show the `N` hottest lines (0: all)")
	fs.StringVar(&f.pprof, "o", "", "write the samples as a gzipped pprof profile to `FILE` (go tool pprof -http=: FILE)")
	fs.StringVar(&f.folded, "folded", "", "write the samples as folded stacks to `FILE`, for flame-graph tools")
}

func (f *profileFlags) check() error {
	if f.freq < 1 || f.freq > 100_000 {
		return usagef("--freq %d: want 1 to 100000 samples a second", f.freq)
	}
	if f.top < 0 {
		return usagef("--lines %d: want a number of lines", f.top)
	}
	return nil
}

// write writes the files the flags name; none without a report.
func (f *profileFlags) write(r *profileReport) error {
	if r == nil {
		return nil
	}
	for _, out := range []struct {
		path  string
		write func(io.Writer) error
	}{{f.pprof, r.samples.WritePprof}, {f.folded, r.samples.WriteFolded}} {
		if out.path == "" {
			continue
		}
		if r.samples == nil {
			return fmt.Errorf("%s: no samples to write: %s", out.path, r.LinesError)
		}
		file, err := os.Create(out.path)
		if err != nil {
			return err
		}
		if err := out.write(file); err != nil {
			file.Close()
			return err
		}
		if err := file.Close(); err != nil {
			return err
		}
	}
	return nil
}

// openProgram opens a loaded program by ID, pinned path or unique name.
func openProgram(arg string) (*ebpf.Program, error) {
	if id, err := strconv.ParseUint(arg, 10, 32); err == nil {
		p, err := ebpf.NewProgramFromID(ebpf.ProgramID(id))
		if err != nil {
			return nil, fmt.Errorf("program %d: %w", id, err)
		}
		return p, nil
	}
	if strings.Contains(arg, "/") {
		p, err := ebpf.LoadPinnedProgram(arg, nil)
		if err != nil {
			return nil, fmt.Errorf("pinned program %s: %w", arg, err)
		}
		return p, nil
	}
	var found *ebpf.Program
	var ids []string
	for id := ebpf.ProgramID(0); ; {
		next, err := ebpf.ProgramGetNextID(id)
		if errors.Is(err, os.ErrNotExist) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("listing programs: %w", err)
		}
		id = next
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue // unloaded meanwhile
		}
		info, err := p.Info()
		if err != nil || info.Name != arg {
			p.Close()
			continue
		}
		ids = append(ids, fmt.Sprint(id))
		if found != nil {
			p.Close()
		} else {
			found = p
		}
	}
	switch {
	case len(ids) == 0:
		return nil, fmt.Errorf("no loaded program is named %q (bpftool prog lists them; names are cut at 15 characters)", arg)
	case len(ids) > 1:
		found.Close()
		owners := programOwners()
		for i, id := range ids {
			if o := owners[id]; len(o) > 0 {
				ids[i] += " held by " + strings.Join(o, ", ")
			}
		}
		return nil, fmt.Errorf("%d loaded programs are named %q: give one's ID (%s)", len(ids), arg, strings.Join(ids, "; "))
	}
	return found, nil
}

// programOwners returns, by program ID, the processes that hold it (a
// descriptor of the program or of a link to it, which /proc/PID/fdinfo
// names by prog_id), as "pid 123 (comm)": which tool loaded which.
func programOwners() map[string][]string {
	out := map[string][]string{}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid := p.Name()
		if _, err := strconv.Atoi(pid); err != nil {
			continue
		}
		fds, _ := os.ReadDir("/proc/" + pid + "/fdinfo")
		seen := map[string]bool{}
		for _, fd := range fds {
			b, err := os.ReadFile("/proc/" + pid + "/fdinfo/" + fd.Name())
			if err != nil {
				continue
			}
			for line := range strings.Lines(string(b)) {
				id, ok := strings.CutPrefix(line, "prog_id:")
				if id = strings.TrimSpace(id); ok && !seen[id] {
					seen[id] = true
					comm, _ := os.ReadFile("/proc/" + pid + "/comm")
					out[id] = append(out[id], fmt.Sprintf("pid %s (%s)", pid, strings.TrimSpace(string(comm))))
				}
			}
		}
	}
	return out
}

// A running profile of a program: its meter, its sampler, and the kernel's
// run-time statistics beside them.
type runningProfile struct {
	name     string
	id       ebpf.ProgramID
	start    time.Time
	prog     *ebpf.Program
	progs    []*ebpf.Program // prog, or the copies that run in its place
	before   []ebpf.ProgramStats
	stats    io.Closer
	meter    *profile.Meter
	meterErr error
	sampler  *profile.Sampler
	lineErr  error
}

// startProfile starts profiling prog, or its copies where it has any: a
// multiprobe.Link's (Link.Programs), which run in its place. The meter
// times the first program that runs; the sampler samples all of them.
func startProfile(prog *ebpf.Program, copies []*ebpf.Program, freq int) (*runningProfile, error) {
	info, err := prog.Info()
	if err != nil {
		return nil, fmt.Errorf("program info: %w", err)
	}
	p := &runningProfile{name: info.Name, prog: prog, progs: []*ebpf.Program{prog}}
	p.id, _ = info.ID()
	if len(copies) > 0 {
		p.progs = copies
	}
	if p.stats, err = ebpf.EnableStats(bpfsys.StatsRunTime); err != nil {
		p.stats = nil // counted where they were on already, else not
	}
	for _, q := range p.progs {
		st, _ := q.Stats()
		if st == nil {
			st = &ebpf.ProgramStats{}
		}
		p.before = append(p.before, *st)
	}
	p.meter, p.meterErr = profile.NewMeter(p.progs[0])
	p.sampler, p.lineErr = profile.NewSampler(prog, profile.SampleOptions{Frequency: freq, Copies: copies})
	if p.lineErr != nil && !errors.Is(p.lineErr, profile.ErrNoLineInfo) {
		p.close()
		return nil, p.lineErr
	}
	p.start = time.Now()
	return p, nil
}

func (p *runningProfile) samplesSoFar() uint64 {
	if p.sampler == nil {
		return 0
	}
	return p.sampler.Samples().Total
}

// close releases what the profile holds; stop calls it.
func (p *runningProfile) close() {
	if p.sampler != nil {
		p.sampler.Close()
	}
	if p.meter != nil {
		p.meter.Close()
	}
	if p.stats != nil {
		p.stats.Close()
		p.stats = nil
	}
}

// stop ends the profile and reports it.
func (p *runningProfile) stop() (*profileReport, error) {
	r := &profileReport{Program: p.name, ID: uint32(p.id), Duration: time.Since(p.start)}
	if len(p.progs) > 1 || p.progs[0] != p.prog {
		r.Copies = len(p.progs)
	}
	for i, q := range p.progs {
		if st, err := q.Stats(); err == nil {
			r.Runs += st.RunCount - p.before[i].RunCount
			r.kernelTime += st.Runtime - p.before[i].Runtime
		}
	}
	if r.Runs > 0 && p.stats != nil {
		r.KernelMean = r.kernelTime / time.Duration(r.Runs)
	}
	if p.meter != nil {
		c, err := p.meter.Read()
		if err != nil {
			return nil, err
		}
		r.Cost = newCostReport(c)
		if o, err := profile.MeasureOverhead(); err == nil {
			r.Cost.OverheadReading, r.Cost.OverheadPerRun = o.Reading, o.PerRun
		}
	} else {
		r.CostError = p.meterErr.Error()
	}
	if p.sampler != nil {
		if err := p.sampler.Close(); err != nil {
			return nil, err
		}
		r.samples = p.sampler.Samples()
		r.Samples, r.Trampolines, r.Other, r.Lost = r.samples.Total, r.samples.Trampolines, r.samples.Other, r.samples.Lost
		r.Frequency = int(time.Second / r.samples.Period)
		for _, l := range r.samples.Lines {
			lr := lineReport{Samples: l.Samples, Self: l.Self, Function: l.Func, File: l.File, Line: l.Line, Source: strings.TrimSpace(l.Source), Callees: []calleeReport{}}
			for _, c := range l.Callees {
				lr.Callees = append(lr.Callees, calleeReport{Function: c.Func, Samples: c.Samples})
			}
			r.Lines = append(r.Lines, lr)
		}
	} else {
		r.LinesError = p.lineErr.Error()
	}
	p.close()
	return r, nil
}

type profileReport struct {
	Program  string        `json:"program"`
	ID       uint32        `json:"id"`
	Duration time.Duration `json:"duration_ns"`
	// Runs is how many times the program ran, by the kernel's run-time
	// statistics, and KernelMean their mean time (0 where the
	// statistics could not be turned on).
	Runs       uint64        `json:"runs"`
	KernelMean time.Duration `json:"kernel_mean_ns"`
	// Copies is how many copies of the program ran in its place (a
	// multiprobe.Link's, one per site on a kernel without BPF cookies):
	// the samples and Runs are all of theirs, Cost the first's alone.
	Copies int `json:"copies,omitempty"`
	// Cost is the meter's; CostError says why there is none.
	Cost      *costReport `json:"cost,omitempty"`
	CostError string      `json:"cost_error,omitempty"`
	// Samples are those in the program, Other those in the kernel
	// elsewhere, Lost those the kernel dropped.
	Frequency int    `json:"frequency_hz,omitempty"`
	Samples   uint64 `json:"samples"`
	// Trampolines are the samples in the fentry and fexit programs
	// attached to the program (the meter's among them), on no line.
	Trampolines uint64       `json:"trampoline_samples"`
	Other       uint64       `json:"other_samples"`
	Lost        uint64       `json:"lost_samples"`
	Lines       []lineReport `json:"lines"`
	// LinesError says why there are no lines.
	LinesError string `json:"lines_error,omitempty"`

	kernelTime time.Duration
	samples    *profile.Samples
}

type costReport struct {
	Runs   uint64        `json:"runs"`
	Nested uint64        `json:"nested"`
	Mean   time.Duration `json:"mean_ns"`
	P50    time.Duration `json:"p50_ns"`
	P95    time.Duration `json:"p95_ns"`
	P99    time.Duration `json:"p99_ns"`
	// Cycles and Instructions per run are null where the machine has no
	// such counter.
	Cycles          *float64      `json:"cycles_per_run"`
	Instructions    *float64      `json:"instructions_per_run"`
	OverheadReading time.Duration `json:"overhead_reading_ns"`
	OverheadPerRun  time.Duration `json:"overhead_per_run_ns"`
}

func newCostReport(c profile.Cost) *costReport {
	r := &costReport{Runs: c.Runs, Nested: c.Nested, Mean: c.Mean(), P50: c.Percentile(0.5), P95: c.Percentile(0.95), P99: c.Percentile(0.99)}
	perRun := func(c profile.Counter) *float64 {
		if v := c.PerRun(); !math.IsNaN(v) {
			return &v
		}
		return nil
	}
	r.Cycles, r.Instructions = perRun(c.Cycles), perRun(c.Instructions)
	return r
}

type lineReport struct {
	// Samples are the line's: Self in its own code, the rest in the
	// kernel functions it called (helpers, map lookups), by Callees.
	Samples  uint64         `json:"samples"`
	Self     uint64         `json:"self"`
	Function string         `json:"function"`
	File     string         `json:"file"`
	Line     int            `json:"line"`
	Source   string         `json:"source"`
	Callees  []calleeReport `json:"callees"`
}

type calleeReport struct {
	Function string `json:"function"`
	Samples  uint64 `json:"samples"`
}

func (r *profileReport) writeText(w io.Writer, top int) {
	fmt.Fprintf(w, "program %s (id %d), %v: %d runs", r.Program, r.ID, r.Duration.Round(time.Millisecond), r.Runs)
	if r.KernelMean > 0 {
		fmt.Fprintf(w, ", mean %v by the kernel's bpf_stats", r.KernelMean)
	}
	fmt.Fprintln(w)
	if c := r.Cost; c != nil {
		of := ""
		if r.Copies > 0 {
			of = fmt.Sprintf(", in the first of %d copies", r.Copies)
		}
		fmt.Fprintf(w, "per run (%d timed%s): mean %v, p50 %v, p95 %v, p99 %v\n", c.Runs, of, c.Mean, c.P50, c.P95, c.P99)
		counter := func(name string, v *float64) string {
			if v == nil {
				return name + " absent (no PMU counter)"
			}
			return fmt.Sprintf("%.0f %s", *v, name)
		}
		fmt.Fprintf(w, "         %s, %s\n", counter("cycles", c.Cycles), counter("instructions", c.Instructions))
		fmt.Fprintf(w, "the meter's own part of each reading: %v (not subtracted); each run costs %v more while metered\n", c.OverheadReading, c.OverheadPerRun)
	} else {
		fmt.Fprintf(w, "no cost per run: %s\n", r.CostError)
	}
	if r.LinesError != "" {
		fmt.Fprintf(w, "no hot lines: %s\n", r.LinesError)
		return
	}
	fmt.Fprintf(w, "%d samples in the program at %d Hz a CPU (%d in fentry/fexit trampolines attached to it, the meter's among them; %d in the kernel elsewhere; %d lost)\n\n", r.Samples, r.Frequency, r.Trampolines, r.Other, r.Lost)
	if len(r.Lines) == 0 {
		return
	}
	fmt.Fprintf(w, "%8s %6s  %s\n", "SAMPLES", "%", "FUNCTION FILE:LINE  SOURCE")
	lines := r.Lines
	if top > 0 && len(lines) > top {
		lines = lines[:top]
	}
	for _, l := range lines {
		where := l.Function
		if l.File != "" {
			where = fmt.Sprintf("%s %s:%d", l.Function, l.File, l.Line)
		}
		fmt.Fprintf(w, "%8d %5.1f%%  %s  %s\n", l.Samples, 100*float64(l.Samples)/float64(r.Samples), where, l.Source)
		for i, c := range l.Callees {
			if i == 3 {
				fmt.Fprintf(w, "%16s  (%d more kernel functions)\n", "", len(l.Callees)-i)
				break
			}
			fmt.Fprintf(w, "%8d %5.1f%%    in %s\n", c.Samples, 100*float64(c.Samples)/float64(r.Samples), c.Function)
		}
	}
}
