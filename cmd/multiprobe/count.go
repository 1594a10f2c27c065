package main

import (
	"cmp"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/args"
	"github.com/multiprobe/multiprobe/count"
	"github.com/multiprobe/multiprobe/elfsym"
	"github.com/multiprobe/multiprobe/internal/bpfsys"
	"github.com/multiprobe/multiprobe/internal/hostarch"
	"github.com/multiprobe/multiprobe/internal/stopped"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/usdt"
)

func init() {
	commands["count"] = &command{
		usage:      "[--pid PID] [-f] [-v] [--duration D] [--top N] [--by pid|file|container] [--max-rate N] [--json] [--stats] [--profile [--freq HZ] [--lines N] [-o FILE.pb.gz] [--folded FILE]] [--args [--nargs N] [--str LIST]] PROBE... [-- CMD ARGS...]",
		short:      "count calls per function through one uprobe_multi link per binary (root)",
		privileges: "CAP_BPF and CAP_PERFMON",
		long: `A PROBE is uprobe:TARGET:PATTERN[,PATTERN...], uretprobe:TARGET:PATTERN...
or usdt:TARGET:PROVIDER:NAME, with globs, as bpftrace writes them. With a
command after "--", the command is started stopped, the probes attached with
its pid as the filter, and then it runs: no call is missed and no other
process's calls count; multiprobe exits with the command's exit status.
With --pid, counting runs until the process exits, --duration passes or
Ctrl-C. With neither, count follows the probes' targets into every process
and container on the machine, now and as they appear (package watch): each
file a target means (a library name, a path, a path glob) is attached once,
the files named here at once, the others as a process maps them, about a
millisecond later; -v prints a line per file (its device, inode and
root). A path names one file, a relative one from the working directory;
a bare name every file of that name. With -f the command's (or --pid's)
descendants count too, as strace -f follows them. --by pid, file or
container splits each function's calls by who made them. A site that
another tracer's uprobe holds with another ref-counter offset is left out
and named, the rest attached. On kernels before 6.6 every site gets a
perf-event uprobe of its own, which is slower to attach, but counts the
same.`,
		examples: []string{
			"count 'uprobe:/bin/bash:sh_*' -- bash -c 'echo hi'",
			"count --pid 1234 --duration 10s 'uprobe:libc.so.6:malloc,free,calloc'",
			"count -v --duration 10s 'uprobe:libc:malloc'  # every process and container, as they start",
			"count --by container --duration 10s 'uprobe:libc:malloc'  # a row for each container's calls",
			"count -f 'uprobe:/bin/bash:xmalloc' -- sh -c 'bash -c true | cat'  # the command's descendants too",
			"count --args --str 0,1 'usdt:/usr/bin/python3.11:python:function__entry' -- python3.11 -c 'pass'",
			"count --args --str 0,ret 'uprobe:libc:getenv' 'uretprobe:libc:getenv' -- ls",
			"count --json --stats 'uprobe:libc.so.6:str*' -- ls /",
			"count --profile -o count.pb.gz --duration 10 'uprobe:libc.so.6:*'",
		},
		run: runCount,
	}
}

type countedSite struct {
	// Probe is the index of the site's probe spec in countReport.Probes:
	// a spec of thousands of patterns is written once, not once a row.
	Probe int `json:"probe"`
	// Kind is the probe's kind: uprobe, uretprobe or usdt.
	Kind     string `json:"kind"`
	Function string `json:"function"`
	Path     string `json:"path"`
	Offset   uint64 `json:"offset"`
	Calls    uint64 `json:"calls"`
	// Sites is how many sites of the probe were hit (a USDT probe can be
	// inlined at many places).
	Sites int `json:"sites"`
	// Who made the calls, with --by pid or container; with --by file a
	// row is per Path.
	caller
}

type countReport struct {
	// Probes are the probe specs as given, which rows name by index.
	Probes   []string      `json:"probes"`
	Kernel   string        `json:"kernel"`
	Path     string        `json:"path"`
	Sites    int           `json:"sites"`
	Called   int           `json:"called"`
	Calls    uint64        `json:"calls"`
	Duration time.Duration `json:"duration_ns"`
	// Counts are the sites called, most calls first: all of them, or the
	// first --top. Never null: [] when nothing was called.
	Counts []countedSite `json:"counts"`
	// Omitted is how many called sites --top left out.
	Omitted int `json:"omitted,omitempty"`
	// By is --by: pid, file or container ("" for none); Unattributed
	// are the calls --by pid or container had no room to attribute
	// (they are in calls).
	By           byFlag `json:"by,omitempty"`
	Unattributed uint64 `json:"unattributed,omitempty"`
	// Stats are the kernel's run-time statistics for the probe program,
	// with --stats.
	Stats *progStats `json:"stats,omitempty"`
	// Profile is the probe program's cost per run and hot lines, with
	// --profile.
	Profile *profileReport `json:"profile,omitempty"`
	// Hits are the hits with their arguments, with --args.
	Hits        []hitRecord `json:"hits,omitempty"`
	HitsDropped uint64      `json:"hits_dropped,omitempty"`
	// LeftOut are the sites the globs selected that cannot be probed, and
	// why (Plan.LeftOut).
	LeftOut []leftOutSite `json:"left_out,omitempty"`
	// Files are the files attached, when count followed every process (no
	// command, no --pid): each as the first process that mapped it names
	// it. A function's row adds up its calls in every file.
	Files []fileEntry `json:"files,omitempty"`
}

// leftOutSite is a site of Plan.LeftOut or Link.LeftOut.
type leftOutSite struct {
	Kind     string `json:"kind"`
	Function string `json:"function"`
	Path     string `json:"path"`
	Offset   uint64 `json:"offset"`
	// Why is the kind of reason, for the summary: unprobeable, no return
	// address, foreign uprobe (another tracer's, with another ref-counter
	// offset) or refused; Reason says it in full.
	Why    string `json:"why"`
	Reason string `json:"reason"`
}

// leftOut lists left-out sites for the report: Resolve's (Plan.LeftOut)
// and the kernel's at attach (Link.LeftOut).
func leftOut(sites ...[]multiprobe.Site) []leftOutSite {
	var out []leftOutSite
	for _, ss := range sites {
		for _, s := range ss {
			out = append(out, leftOutSite{Kind: s.ProbeKind(), Function: s.Name, Path: s.Path, Offset: s.Offset, Why: whyLeftOut(s.LeftOut), Reason: s.LeftOut.Error()})
		}
	}
	return out
}

// whyLeftOut is the kind of reason err is, for leftOutSite.Why.
func whyLeftOut(err error) string {
	switch {
	case errors.Is(err, multiprobe.ErrNoReturnAddress):
		return "no return address"
	case errors.Is(err, kernelprobe.ErrUnprobeable):
		return "unprobeable"
	case errors.Is(err, unix.EINVAL):
		return "foreign uprobe"
	}
	return "refused"
}

// leftOutWhy says, for the summary, what each Why means.
var leftOutWhy = map[string]string{
	"unprobeable":       "at an instruction the kernel will not place a uprobe at",
	"no return address": "entered without a return address",
	"foreign uprobe":    "where another tracer's uprobe has another ref-counter offset",
	"refused":           "refused by the kernel",
}

// maxLeftOutLines is how many left-out sites count's text names; --json
// has them all.
const maxLeftOutLines = 5

// writeLeftOut says which sites were left out and why: each, or how many
// for each reason where there are many.
func writeLeftOut(w io.Writer, sites []leftOutSite) {
	if len(sites) == 0 {
		return
	}
	if len(sites) <= maxLeftOutLines {
		for _, s := range sites {
			fmt.Fprintf(w, "left out %s:%s: %s\n", s.Kind, s.Function, s.Reason)
		}
		return
	}
	n := map[string]int{}
	for _, s := range sites {
		n[s.Why]++
	}
	var why []string
	for _, k := range []string{"unprobeable", "no return address", "foreign uprobe", "refused"} {
		if n[k] > 0 {
			why = append(why, fmt.Sprintf("%d %s", n[k], leftOutWhy[k]))
		}
	}
	fmt.Fprintf(w, "%d sites left out: %s (--json lists them)\n", len(sites), strings.Join(why, ", "))
}

type progStats struct {
	Runs      uint64        `json:"runs"`
	Runtime   time.Duration `json:"runtime_ns"`
	PerRunAvg time.Duration `json:"per_run_avg_ns"`
}

// countFlags are count's flags beyond the tracer's.
type countFlags struct {
	trace     traceFlags
	profile   profileFlags
	stats     bool
	profiling bool
	withArgs  bool
	nargs     int
	strs      strArgs
	maxRate   int
}

// parseCountFlags parses count's command line into its flags, probe specs
// and the command after "--", and checks them against each other.
func parseCountFlags(args []string) (f *countFlags, specs, command []string, err error) {
	f = &countFlags{}
	fs := newFlagSet("count")
	f.trace.register(fs, "sites with the most calls")
	fs.BoolVar(&f.stats, "stats", false, "turn on the kernel's BPF run-time statistics and print the cost per hit")
	fs.BoolVar(&f.profiling, "profile", false, "profile the probe program while it counts: its cost per run and its hot source lines, as the profile command does")
	f.profile.register(fs)
	fs.BoolVar(&f.withArgs, "args", false, "print every hit with its arguments as integers: a USDT probe's, a uprobe's first --nargs, a uretprobe's return value")
	fs.IntVar(&f.nargs, "nargs", 3, "with --args, the `N` (0 to 6) first integer arguments of a uprobe's function, from the registers of its calling convention (C's, or Go's in a Go program)")
	fs.IntVar(&f.maxRate, "max-rate", defaultMaxRate, "warn, after the first second, when the probes hit more than `N` times a second (each hit traps into the kernel, which slows the traced programs), naming the hottest sites; 0 never warns")
	fs.Var(&f.strs, "str", "with --args, print these arguments as C strings (read up to 127 bytes): a comma-separated `LIST` of argument numbers from 0, a USDT probe's or a uprobe's, and ret, a uretprobe's return value; at most 3")
	if specs, command, err = parseFlags(fs, args); err != nil {
		return nil, nil, nil, err
	}
	if err := f.trace.check(specs, command); err != nil {
		return nil, nil, nil, err
	}
	switch {
	case f.maxRate < 0:
		return nil, nil, nil, usagef("--max-rate %d: want a number of hits a second, or 0", f.maxRate)
	case f.nargs < 0 || f.nargs > 6:
		return nil, nil, nil, usagef("--nargs %d: want 0 to 6 (the arguments passed in registers)", f.nargs)
	case f.trace.by != byNone && f.withArgs:
		return nil, nil, nil, usagef("--by counts, --args prints each hit: give one")
	case len(f.strs) > 0 && !f.withArgs:
		return nil, nil, nil, usagef("--str prints arguments: give --args too")
	}
	if err := f.profile.check(); err != nil {
		return nil, nil, nil, err
	}
	if f.profiling {
		f.trace.profiling = &f.profile
	} else if f.profile.pprof != "" || f.profile.folded != "" {
		return nil, nil, nil, usagef("-o and --folded write the probe program's profile: give --profile too")
	}
	return f, specs, command, nil
}

func runCount(args []string, stdout, stderr io.Writer) error {
	// The hits printed with --args and the report share stdout from two
	// goroutines; the command's output goes to the same places (as the
	// files themselves where they are files, so that it sees a terminal).
	rawStdout, rawStderr := stdout, stderr
	stdout, stderr = &syncWriter{w: stdout}, &syncWriter{w: stderr}
	f, specs, command, err := parseCountFlags(args)
	if err != nil {
		return err
	}
	probes, err := multiprobe.ParseProbes(specs...)
	if err != nil {
		return usagef("%v", err)
	}
	tr, err := newTracer(&f.trace, command, rawStdout, rawStderr, stdout, stderr)
	if err != nil {
		return err
	}
	defer tr.close()
	if f.trace.following(command) {
		return runCountFollow(f, probes, tr, stdout, stderr)
	}
	// The pid is known before Resolve: the plan decides from it whether
	// the kernel filters or Prepare gives the program the in-BPF filter.
	plan, err := multiprobe.Resolve(probes, tr.opts)
	if err != nil {
		return err
	}
	defer plan.Close()
	c, err := loadCounter(plan, f.withArgs, f.nargs, f.strs, f.trace.by)
	if err != nil {
		return err
	}
	defer c.close()
	sites := plan.Sites()
	var hitLog []hitRecord
	stop, err := c.startExtras(f, stdout, &hitLog)
	if err != nil {
		return err
	}
	defer stop()

	if f.trace.pid != 0 {
		for _, p := range unmapped(f.trace.pid, sites) {
			fmt.Fprintf(stderr, "process %d does not map %s: only what it maps later (dlopen) can count\n", f.trace.pid, p)
		}
	}
	meter := startHitMeter(c.counts, func() int { return len(sites) }, func(i uint32) string { return sites[i].Label() }, f.maxRate, stderr)
	end, err := tr.run(plan, c.prog, stderr)
	meter.stop()
	if c.stopHits != nil {
		c.stopHits()
	}
	if err != nil {
		return err
	}
	report, err := c.report(probes, sites, f.trace.top, f.trace.by)
	if err != nil {
		return err
	}
	report.Kernel, report.Path, report.Duration = tr.features.Release, tr.features.Path().String(), end.elapsed
	report.LeftOut = leftOut(plan.LeftOut(), end.leftOut)
	report.Sites -= len(end.leftOut)
	if err := report.finish(f, end, hitLog, c); err != nil {
		return err
	}
	err = report.write(stdout, f, end)
	if report.Calls == 0 && report.Sites > 0 && tr.child != nil && !f.trace.children {
		zeroHint(stderr, tr.child, sites)
	}
	return err
}

// unmapped returns the files of sites that process pid does not map now.
func unmapped(pid int, sites []multiprobe.Site) []string {
	maps, err := elfsym.ExecutableMappings(pid)
	if err != nil {
		return nil
	}
	var out []string
	for _, path := range sitePaths(sites) {
		var st unix.Stat_t
		if unix.Stat(path, &st) != nil {
			continue
		}
		if !slices.ContainsFunc(maps, func(m elfsym.Mapping) bool { return m.Inode == st.Ino }) {
			out = append(out, path)
		}
	}
	return out
}

// sitePaths are the files of sites, each once, in order.
func sitePaths(sites []multiprobe.Site) []string {
	var out []string
	for _, s := range sites {
		if len(out) == 0 || out[len(out)-1] != s.Path {
			if !slices.Contains(out, s.Path) {
				out = append(out, s.Path)
			}
		}
	}
	return out
}

// zeroHint says, after a command that made no counted call, the likely
// cause it can see: the command ran another program than a target (a
// shell script, a shim that runs the real program, timeout), whose calls
// were in a child, which the pid filter leaves out without -f.
func zeroHint(stderr io.Writer, child *stoppedCommand, sites []multiprobe.Site) {
	paths := sitePaths(sites)
	if child.exe != "" && !slices.ContainsFunc(paths, func(p string) bool { return sameFile(p, child.exe) }) && !slices.ContainsFunc(paths, isLibrary) {
		fmt.Fprintf(stderr, "no call counted: %s ran %s, not %s; if it runs that in a child, -f counts the command's descendants too\n",
			child.name, child.exe, strings.Join(paths, ", "))
		return
	}
	fmt.Fprintf(stderr, "no call counted: if %s runs the target in a child process (a shell, timeout, a pipeline), -f counts its descendants too\n", child.name)
}

// isLibrary reports whether path is a shared library by its name.
func isLibrary(path string) bool { return strings.Contains(filepath.Base(path), ".so") }

// startExtras starts what --args and --stats add to counting: the reader
// that prints (or, for --json, logs into *hitLog) each hit, and the
// kernel's run-time statistics. stop ends both.
func (c *counter) startExtras(f *countFlags, stdout io.Writer, hitLog *[]hitRecord) (stop func(), err error) {
	var stops []func()
	stop = func() {
		for _, s := range slices.Backward(stops) {
			s()
		}
	}
	if f.withArgs {
		wait, err := c.readHits(f.strs, stdout, f.trace.asJSON, hitLog)
		if err != nil {
			return nil, err
		}
		stops = append(stops, wait)
	}
	if f.stats {
		statsOff, err := ebpf.EnableStats(bpfsys.StatsRunTime)
		if err != nil {
			stop()
			return nil, fmt.Errorf("--stats: enabling BPF run-time statistics: %w", err)
		}
		stops = append(stops, func() { statsOff.Close() })
	}
	return stop, nil
}

// finish adds to the report what --stats, --profile and --args asked for
// (the profile written where -o and --folded say), in every mode alike.
func (report *countReport) finish(f *countFlags, end countEnd, hitLog []hitRecord, c *counter) error {
	if f.stats {
		st := end.stats
		ps := &progStats{Runs: st.RunCount, Runtime: st.Runtime}
		if ps.Runs > 0 {
			ps.PerRunAvg = ps.Runtime / time.Duration(ps.Runs)
		}
		report.Stats = ps
	}
	report.Profile = end.profile
	if err := f.profile.write(end.profile); err != nil {
		return err
	}
	if f.withArgs {
		report.Hits = hitLog
		if d, err := c.tracer.Dropped(); err == nil {
			report.HitsDropped = d
		}
	}
	return nil
}

// write writes the report, as JSON with --json; it returns the exit status
// of end.
func (report *countReport) write(stdout io.Writer, f *countFlags, end countEnd) error {
	if f.trace.asJSON {
		if err := writeJSON(stdout, report); err != nil {
			return err
		}
		return end.status()
	}
	report.writeText(stdout, f.profile.top, f.trace.verbose)
	return end.status()
}

// readHits starts printing (or, with asJSON, logging into *log) the hits
// of the --args program as they come, and returns what waits for the
// reader to end; c.stopHits, once the probes are detached, makes it end
// after the last hit in the buffer.
func (c *counter) readHits(strs strArgs, stdout io.Writer, asJSON bool, log *[]hitRecord) (wait func(), err error) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		*log = readHits(c.tracer, strs, stdout, asJSON)
	}()
	c.stopHits = func() {
		// The reader returns what is in the buffer, then ErrFlushed.
		c.tracer.Flush()
		<-done
	}
	return func() {
		c.tracer.Close()
		<-done
	}, nil
}

// report reads the counts of sites into a report: its probes, and the
// sites called, most calls first, the first top of them if top > 0. A
// USDT probe inlined at many places has many sites: it is one row, under
// its first site's offset.
func (c *counter) report(probes []multiprobe.Probe, sites []multiprobe.Site, top int, by byFlag) (countReport, error) {
	report := countReport{Sites: len(sites), Counts: []countedSite{}}
	counts := make([]uint64, len(sites))
	var snap *count.Snapshot
	if c.calls != nil {
		var err error
		if snap, err = c.calls.Read(sites); err != nil {
			return report, err
		}
		for i := range snap.Sites {
			counts[i] = snap.Sites[i].Calls
		}
	} else {
		for i := range sites {
			if err := c.counts.Lookup(uint32(sites[i].Cookie), &counts[i]); err != nil {
				return report, fmt.Errorf("reading count of %s: %w", sites[i].Name, err)
			}
		}
	}
	usdtRow := map[string]int{}
	// The probes as given, each once however many files a follow run
	// resolved it in (each file's sites have a Probe of their own).
	probeIndex := map[string]int{}
	byPointer := map[*multiprobe.Probe]int{}
	report.Probes = []string{}
	index := func(p *multiprobe.Probe) int {
		if i, ok := byPointer[p]; ok {
			return i
		}
		spec := p.String()
		i, ok := probeIndex[spec]
		if !ok {
			i = len(report.Probes)
			probeIndex[spec] = i
			report.Probes = append(report.Probes, spec)
		}
		byPointer[p] = i
		return i
	}
	for i := range probes {
		index(&probes[i])
	}
	for _, s := range sites {
		index(s.Probe)
	}
	for i, s := range sites {
		report.Calls += counts[i]
		if counts[i] == 0 {
			continue
		}
		report.Called++
		if s.USDT != nil {
			key := s.Path + "\x00" + s.Name
			if row, ok := usdtRow[key]; ok {
				report.Counts[row].Calls += counts[i]
				report.Counts[row].Sites++
				continue
			}
			usdtRow[key] = len(report.Counts)
		}
		report.Counts = append(report.Counts, countedSite{
			Probe: index(s.Probe), Kind: s.Probe.Kind.String(), Function: s.Label(), Path: s.Path, Offset: s.Offset, Calls: counts[i], Sites: 1,
		})
	}
	slices.SortStableFunc(report.Counts, func(a, b countedSite) int {
		return cmp.Or(cmp.Compare(b.Calls, a.Calls), cmp.Compare(a.Function, b.Function), cmp.Compare(a.Kind, b.Kind))
	})
	report.By = by
	if (by == byPID || by == byContainer) && snap != nil {
		report.Counts, report.Unattributed = rowsBy(by, snap, index)
	}
	if top > 0 && len(report.Counts) > top {
		report.Omitted = len(report.Counts) - top
		report.Counts = report.Counts[:top]
	}
	return report, nil
}

// writeText writes the report as count's table; profileTop is --lines.
func (report *countReport) writeText(w io.Writer, profileTop int, verbose bool) {
	if report.HitsDropped > 0 {
		fmt.Fprintf(w, "%d hits did not fit in the ring buffer and were not printed\n", report.HitsDropped)
	}
	width := len("CALLS")
	if len(report.Counts) > 0 {
		width = max(width, len(fmt.Sprint(report.Counts[0].Calls)))
	}
	kindWidth := len("KIND")
	for _, c := range report.Counts {
		kindWidth = max(kindWidth, len(c.Kind))
	}
	if report.By == byNone {
		fmt.Fprintf(w, "%*s  %-*s  %s\n", width, "CALLS", kindWidth, "KIND", "FUNCTION")
		for _, c := range report.Counts {
			fmt.Fprintf(w, "%*d  %-*s  %s\n", width, c.Calls, kindWidth, c.Kind, c.Function)
		}
	} else {
		fnWidth := len("FUNCTION")
		for _, c := range report.Counts {
			fnWidth = max(fnWidth, len(c.Function))
		}
		fmt.Fprintf(w, "%*s  %-*s  %-*s  %s\n", width, "CALLS", kindWidth, "KIND", fnWidth, "FUNCTION", strings.ToUpper(string(report.By)))
		for _, c := range report.Counts {
			fmt.Fprintf(w, "%*d  %-*s  %-*s  %s\n", width, c.Calls, kindWidth, c.Kind, fnWidth, c.Function, c.who(report.By, c.Path))
		}
	}
	if report.Omitted > 0 {
		fmt.Fprintf(w, "(%d more %s called, left out by --top)\n", report.Omitted, plural(report.Omitted, "site", "sites"))
	}
	left := ""
	if n := len(report.LeftOut); n > 0 {
		left = fmt.Sprintf(", %d more left out", n)
	}
	fmt.Fprintf(w, "%d %s to %d of %d %s in %v (%s)%s\n",
		report.Calls, plural(int(min(report.Calls, 2)), "call", "calls"), report.Called, report.Sites, plural(report.Sites, "site", "sites"),
		report.Duration.Round(time.Millisecond), report.Path, left)
	if report.Unattributed > 0 {
		fmt.Fprintf(w, "%d calls not attributed by %s: the table of %d was full\n", report.Unattributed, report.By, maxByCounts)
	}
	writeLeftOut(w, report.LeftOut)
	if report.Files != nil {
		fmt.Fprintf(w, "in %d %s, following every process%s\n", len(report.Files), plural(len(report.Files), "file", "files"), namesThem(verbose))
	}
	if s := report.Stats; s != nil {
		fmt.Fprintf(w, "probe program: %d runs, %v in all, %v per run on average\n", s.Runs, s.Runtime, s.PerRunAvg)
	}
	if report.Profile != nil {
		fmt.Fprintln(w)
		report.Profile.writeText(w, profileTop)
	}
}

// secondsFlag is a duration flag that also takes a bare number of seconds
// ("--duration 5"), as bpftrace users and timeout(1) write one.
type secondsFlag time.Duration

func (d *secondsFlag) String() string { return time.Duration(*d).String() }

func (d *secondsFlag) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		f, ferr := strconv.ParseFloat(s, 64)
		if ferr != nil || math.IsNaN(f) || math.IsInf(f, 0) || f > math.MaxInt64/1e9 {
			return fmt.Errorf("%q is not a duration: want seconds (5, 2.5) or a Go duration (10s, 1m30s)", s)
		}
		v = time.Duration(f * float64(time.Second))
	}
	if v <= 0 {
		return fmt.Errorf("%q: want a duration above zero", s)
	}
	*d = secondsFlag(v)
	return nil
}

// countEnd says how counting ended.
type countEnd struct {
	elapsed time.Duration // from attach to the end, detach not included
	signal  os.Signal     // SIGINT or SIGTERM, if one ended it
	// stats sum the run-time statistics of the attached programs, read
	// before the detach: the link's copies of the program where it has
	// any (a pid filter in BPF, or no BPF cookies), whose runs the loaded
	// program's own statistics do not count.
	stats ebpf.ProgramStats
	// code is the command's exit status, as a shell reports it, when it
	// ended on its own.
	code int
	// profile is the probe program's, with --profile.
	profile *profileReport
	// leftOut are the sites the kernel refused at attach (Link.LeftOut).
	leftOut []multiprobe.Site
}

// status is multiprobe's exit status for the way counting ended: 128 plus
// the signal's number, as a shell reports a command a signal ended, when
// SIGINT or SIGTERM ended it; else the traced command's own status, so that
// `multiprobe count ... -- make test` fails where `make test` would. The
// counts are printed either way.
func (e countEnd) status() error {
	if sig, ok := e.signal.(syscall.Signal); ok {
		return &exitStatus{code: 128 + int(sig)}
	}
	if e.code != 0 {
		return &exitStatus{code: e.code}
	}
	return nil
}

// countUntil attaches, resumes the command if there is one, and counts
// until the first of: the command (or the --pid process) exits, duration
// passes, or SIGINT or SIGTERM arrives. A command it started never
// outlives it: at the deadline or on a signal it is ended (SIGTERM, then
// SIGKILL after a grace period), and its Pdeathsig ends it if multiprobe
// itself is killed. The probes are detached before it returns.
func countUntil(plan *multiprobe.Plan, prog *ebpf.Program, child *stoppedCommand, pid int, duration time.Duration, profiling *profileFlags, verbose bool, stderr io.Writer) (end countEnd, err error) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	l, err := plan.Attach(prog)
	if err != nil {
		return end, err
	}
	defer l.Close()
	end.leftOut = l.LeftOut()
	if verbose {
		sayAttached(stderr, l.Sites(), end.leftOut)
	}
	var prof *runningProfile
	if profiling != nil {
		// The link's copies of the program run in its place, where
		// it has any.
		var copies []*ebpf.Program
		if progs := l.Programs(); progs[0] != prog {
			copies = progs
		}
		if prof, err = startProfile(prog, copies, profiling.freq); err != nil {
			return end, fmt.Errorf("--profile: %w", err)
		}
		defer prof.close()
	}
	start := time.Now()
	var exited <-chan struct{}
	switch {
	case child != nil:
		if err := child.Resume(); err != nil {
			return end, err
		}
		exited = child.Done()
	case pid != 0:
		exited = processExit(pid)
	case duration == 0:
		fmt.Fprintf(stderr, "tracing %d %s; Ctrl-C to stop\n", plan.Len(), plural(plan.Len(), "site", "sites"))
	}
	var deadline <-chan time.Time
	if duration > 0 {
		deadline = time.After(duration)
	}
	select {
	case <-exited:
		if child != nil {
			end.code = child.report(stderr)
		} else {
			fmt.Fprintf(stderr, "process %d exited\n", pid)
		}
	case <-deadline:
		if child != nil {
			fmt.Fprintf(stderr, "%s still running after %v: ending it\n", child.name, duration)
			child.stop(stderr)
		}
	case end.signal = <-sigs:
		fmt.Fprintf(stderr, "%v: detaching\n", end.signal)
		if child != nil {
			child.stop(stderr)
		}
	}
	end.elapsed = time.Since(start)
	if prof != nil {
		if end.profile, err = prof.stop(); err != nil {
			return end, fmt.Errorf("--profile: %w", err)
		}
	}
	for _, p := range l.Programs() {
		if st, err := p.Stats(); err == nil {
			end.stats.RunCount += st.RunCount
			end.stats.Runtime += st.Runtime
		}
	}
	return end, nil
}

// sayAttached writes, for -v, a line per file of sites: its path, its
// device and inode (what the kernel probes, and what tells two copies of
// a path apart), and how many sites it has.
func sayAttached(w io.Writer, sites, leftOut []multiprobe.Site) {
	var paths []string
	n := map[string]int{}
	for _, s := range sites {
		if _, ok := n[s.Path]; !ok {
			paths = append(paths, s.Path)
		}
		n[s.Path]++
	}
	for _, s := range leftOut {
		n[s.Path]--
	}
	for _, p := range paths {
		fmt.Fprintf(w, "attached %s (%s): %d %s\n", p, fileID(p), n[p], plural(n[p], "site", "sites"))
	}
}

// fileID names the file at path by device and inode, as a process's maps
// do: "dev 254:1 inode 1234".
func fileID(path string) string {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return "not there: " + err.Error()
	}
	return fmt.Sprintf("dev %d:%d inode %d", unix.Major(uint64(st.Dev)), unix.Minor(uint64(st.Dev)), st.Ino)
}

// processExit returns a channel that receives when process pid exits:
// through a pidfd (Linux 5.3+), or by polling where there is none.
func processExit(pid int) <-chan struct{} {
	done := make(chan struct{})
	fd, err := pidfdOpen(pid)
	go func() {
		if err == nil {
			defer unix.Close(fd)
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			for {
				if _, err := unix.Poll(fds, -1); err != unix.EINTR {
					break
				}
			}
			close(done)
			return
		}
		for unix.Kill(pid, 0) != unix.ESRCH {
			time.Sleep(100 * time.Millisecond)
		}
		close(done)
	}()
	return done
}

// stoppedCommand is the command after "--": started stopped at its first
// instruction (package stopped), so that the probes are attached, with its
// pid as the filter, before it makes a single call.
type stoppedCommand struct {
	*stopped.Process
	name string
	exe  string // the program it runs, as /proc/PID/exe says, "" if unknown
}

func startStopped(command []string, stdout, stderr io.Writer, asJSON bool) (*stoppedCommand, error) {
	cmd := exec.Command(command[0], command[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	if asJSON {
		cmd.Stdout = stderr // keep stdout for the report
	}
	// stopped.Start's Pdeathsig: if multiprobe is killed, so is the
	// command.
	p, err := stopped.Start(cmd)
	if err != nil {
		return nil, startError(command[0], err)
	}
	// Stopped after its exec: the program it runs (an interpreter, for
	// a script).
	exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", p.PID()))
	return &stoppedCommand{Process: p, name: command[0], exe: exe}, nil
}

// startError says why command could not start, in one line: "cannot run
// NAME: no such file or directory", without the layers of exec and the
// stopped start.
func startError(name string, err error) error {
	var pe *fs.PathError
	var ee *exec.Error
	switch {
	case errors.As(err, &ee):
		err = ee.Err
	case errors.As(err, &pe):
		err = pe.Err
	}
	if errors.Is(err, exec.ErrNotFound) {
		return fmt.Errorf("cannot run %s: not found in $PATH", name)
	}
	return fmt.Errorf("cannot run %s: %w", name, err)
}

// report says how the command ended, if not with status 0, and returns
// its exit status.
func (c *stoppedCommand) report(stderr io.Writer) int {
	status, err := c.Wait()
	// 128 plus a signal's number is also an exit code a program may
	// choose (sh -c 'exit 156'): only the wait status tells them apart.
	var ws syscall.WaitStatus
	if ps := c.Cmd.ProcessState; ps != nil {
		ws, _ = ps.Sys().(syscall.WaitStatus)
	}
	switch {
	case err != nil:
		fmt.Fprintf(stderr, "waiting for %s: %v\n", c.name, err)
		return 1
	case ws.Signaled():
		fmt.Fprintf(stderr, "%s was killed by %s (%v)\n", c.name, unix.SignalName(ws.Signal()), ws.Signal())
	case status != 0:
		fmt.Fprintf(stderr, "%s exited with status %d\n", c.name, status)
	}
	return status
}

// stopGrace is how long the command has to exit after SIGTERM.
const stopGrace = 2 * time.Second

// stop ends the running command: SIGTERM, then SIGKILL if it has not exited
// within stopGrace.
func (c *stoppedCommand) stop(stderr io.Writer) {
	c.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.Done():
	case <-time.After(stopGrace):
		c.Kill()
	}
	c.report(stderr)
}

// counter is the loaded counting program: count.c, or count_args.c with
// --args.
type counter struct {
	prog     *ebpf.Program
	counts   *ebpf.Map
	calls    *count.Counter // package count's, without --args
	tracer   *args.Tracer   // package args', with --args
	close    func() error
	stopHits func()
}

// countBy is --by as package count counts: by process or cgroup in BPF;
// --by file needs nothing of BPF (a site is in one file).
func countBy(by byFlag) count.By {
	switch by {
	case byPID:
		return count.ByProcess
	case byContainer:
		return count.ByCgroup
	}
	return count.BySite
}

// fromCount is the counter of package count's c.
func fromCount(c *count.Counter) *counter {
	return &counter{prog: c.Program(), counts: c.Map(), calls: c, close: c.Close}
}

// loadCounter loads the counting program for plan: package count's, or
// package args' with --args, with nargs arguments and strs read as strings.
func loadCounter(plan *multiprobe.Plan, withArgs bool, nargs int, strs strArgs, by byFlag) (*counter, error) {
	if !withArgs {
		c, err := count.New(plan, &count.Options{By: countBy(by), MaxBy: maxByCounts})
		if err != nil {
			return nil, err
		}
		return fromCount(c), nil
	}
	if err := knownRegisters("--args"); err != nil {
		return nil, err
	}
	tr, err := args.New(plan, argsOptions(nargs, strs, 0))
	if err != nil {
		return nil, err
	}
	return fromTracer(tr), nil
}

// followCounter loads the counting program for a follow run, whose
// plans have opts, and returns the spec it loaded for the watch.
func followCounter(withArgs bool, nargs int, strs strArgs, by byFlag, opts *multiprobe.Options) (*ebpf.CollectionSpec, *counter, error) {
	if !withArgs {
		c, err := count.NewForWatch(opts, &count.Options{By: countBy(by), MaxBy: maxByCounts, Cookies: followSlots})
		if err != nil {
			return nil, nil, err
		}
		return c.Spec(), fromCount(c), nil
	}
	if err := knownRegisters("--args"); err != nil {
		return nil, nil, err
	}
	tr, err := args.NewForWatch(opts, argsOptions(nargs, strs, followSlots))
	if err != nil {
		return nil, nil, err
	}
	return tr.Spec(), fromTracer(tr), nil
}

// argsOptions are package args' options for --nargs and --str.
func argsOptions(nargs int, strs strArgs, cookies int) *args.Options {
	o := &args.Options{Args: nargs, Cookies: cookies}
	for _, n := range strs {
		if n == strRet {
			o.Strings = append(o.Strings, args.Ret)
		} else {
			o.Strings = append(o.Strings, int(n))
		}
	}
	return o
}

// fromTracer is the counter of package args' tr.
func fromTracer(tr *args.Tracer) *counter {
	return &counter{prog: tr.Program(), counts: tr.Map(), tracer: tr, close: tr.Close}
}

// newCollection loads spec, what names it in errors.
func newCollection(what string, spec *ebpf.CollectionSpec) (*ebpf.Collection, error) {
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		if errors.Is(err, unix.EPERM) {
			return nil, fmt.Errorf("loading %s: %w (run as root, or with CAP_BPF and CAP_PERFMON)", what, err)
		}
		return nil, fmt.Errorf("loading %s: %w", what, err)
	}
	return coll, nil
}

// hitRecord is one hit with its arguments, for --args.
type hitRecord struct {
	Probe string `json:"probe"`
	Kind  string `json:"kind"`
	// Args are a USDT probe's arguments, or the first --nargs integer
	// arguments of a uprobe's function.
	Args []int64 `json:"args"`
	// Ret is a uretprobe's return value.
	Ret *int64 `json:"ret,omitempty"`
	// Strings are the --str arguments read as C strings, under "arg0",
	// "arg1", ... and "ret"; one that could not be read is left out.
	Strings map[string]string `json:"strings,omitempty"`
}

// strArgs are the arguments --str reads as strings: argument numbers, and
// strRet for the return value, as count_args.c's str_arg takes them.
type strArgs []uint32

const (
	maxStrArgs = 3    // count_args.c's STR_MAX
	maxStrLen  = 128  // STR_LEN
	strRet     = 6    // regs[6], the return value
	strNone    = 0xff // STR_NONE
)

func (s *strArgs) String() string { return fmt.Sprint(*s) }

func (s *strArgs) Set(v string) error {
	for w := range strings.SplitSeq(v, ",") {
		n, err := strconv.ParseUint(strings.TrimPrefix(w, "arg"), 10, 32)
		switch {
		case w == "ret":
			n = strRet
		case err != nil || n >= usdt.MaxArgs:
			return fmt.Errorf("%q: want argument numbers from 0 to %d, or ret", w, usdt.MaxArgs-1)
		}
		if !slices.Contains(*s, uint32(n)) {
			*s = append(*s, uint32(n))
		}
	}
	if len(*s) > maxStrArgs {
		return fmt.Errorf("%q: at most %d strings", v, maxStrArgs)
	}
	return nil
}

// name is how the JSON report names argument n.
func (s strArgs) name(n uint32) string {
	if n == strRet {
		return "ret"
	}
	return fmt.Sprintf("arg%d", n)
}

// knownRegisters refuses what reads registers on a machine whose struct
// pt_regs count_args.c and latency.c do not lay out: their objects exist
// for every 64-bit Linux machine multiprobe reads binaries of
// (hostarch.Machine), and 386 builds x86-64's.
func knownRegisters(what string) error {
	if hostarch.Machine == elf.EM_NONE {
		return fmt.Errorf("%s reads registers, whose layout multiprobe knows on amd64, arm64, riscv64, s390x and ppc64le, not on %s: %w",
			what, runtime.GOARCH, ebpf.ErrNotSupported)
	}
	return nil
}

// maxHitLog bounds the hits kept for the JSON report.
const maxHitLog = 100_000

// cArgRegs and goArgRegs are the indexes into a hit's registers of a
// function's first six integer arguments: in the C calling convention, and
// in Go's (ABIInternal: RAX, RBX, RCX, RDI, RSI, R8 on x86-64, the same
// registers as C's on arm64). A Go program's strings are a pointer and a
// length, not C strings: --str prints numbers there.
var cArgRegs, goArgRegs = []int{0, 1, 2, 3, 4, 5}, func() []int {
	if runtime.GOARCH == "amd64" {
		return []int{6, 7, 3, 0, 1, 4}
	}
	return []int{0, 1, 2, 3, 4, 5}
}()

// isGoProgram reports whether path is a Go program. A C function linked
// into one (cgo) is taken for Go's too.
func isGoProgram(path string) bool {
	f, err := elfsym.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	return f.IsGo()
}

// readHits prints (or, for JSON, collects) tr's hits until it is
// flushed or closed, naming the --str strings as strs does.
func readHits(tr *args.Tracer, strs strArgs, stdout io.Writer, asJSON bool) []hitRecord {
	var log []hitRecord
	var line []byte
	for {
		h, err := tr.Read()
		if errors.Is(err, args.ErrFlushed) || errors.Is(err, args.ErrClosed) {
			return log
		}
		if err != nil {
			continue
		}
		r, str := hitOf(h, strs)
		if asJSON {
			if len(log) < maxHitLog {
				log = append(log, r)
			}
			continue
		}
		// One write a line: the traced command may write to the same
		// pipe, and a write this short is not split up.
		line = appendHit(line[:0], r, str)
		stdout.Write(line)
	}
}

// hitOf is h as the report has it, and its strings by --str's numbers
// (strRet for the return value).
func hitOf(h args.Hit, strs strArgs) (hitRecord, map[uint32]string) {
	r := hitRecord{Probe: h.Site.Name, Kind: h.Site.Probe.Kind.String(), Args: h.Args, Ret: h.Ret}
	str := map[uint32]string{}
	for n, v := range h.Strings {
		k := uint32(n)
		if n == args.Ret {
			k = strRet
		}
		str[k] = v
		if r.Strings == nil {
			r.Strings = map[string]string{}
		}
		r.Strings[strs.name(k)] = v
	}
	return r, str
}

// appendHit appends a hit's line: the probe, its return value or its
// arguments, strings quoted.
func appendHit(line []byte, h hitRecord, str map[uint32]string) []byte {
	line = append(line, h.Probe...)
	if h.Ret != nil {
		line = append(line, " returned"...)
		if v, ok := str[strRet]; ok {
			line = strconv.AppendQuote(append(line, ' '), v)
		} else {
			line = fmt.Appendf(line, " %d", *h.Ret)
		}
	}
	for i, a := range h.Args {
		if v, ok := str[uint32(i)]; ok {
			line = strconv.AppendQuote(append(line, ' '), v)
		} else {
			line = fmt.Appendf(line, " %d", a)
		}
	}
	return append(line, '\n')
}

// childWriter is what a command's output is written to: the file itself,
// if raw is one, else synced, which serialises it with ours.
func childWriter(raw, synced io.Writer) io.Writer {
	if f, ok := raw.(*os.File); ok {
		return f
	}
	return synced
}

// syncWriter serialises writes from several goroutines.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
