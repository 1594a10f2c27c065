package main

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/latency"
)

func init() {
	commands["latency"] = &command{
		usage:      "[--pid PID] [-f] [-v] [--duration D] [--top N] [--by pid|file|container] [--json] PROBE... [-- CMD ARGS...]",
		short:      "per-function latency histograms over many functions at once (root)",
		privileges: "CAP_BPF and CAP_PERFMON",
		long: `A PROBE is uprobe:TARGET:PATTERN[,PATTERN...], with globs, as bpftrace
writes it. Every function it matches gets a log2 histogram of the time from
its entry to its return, like bcc's funclatency, but over thousands of
functions with one attach. Functions are listed by the total time spent in
them, their histograms drawn in the terminal. The command after "--", the
--pid process, --duration and Ctrl-C work as they do for count; with
neither a command nor --pid, latency follows the targets into every
process and container as count does (-v names each file), timing by entry
and return probes. -f and --by work as they do for count. Each time
includes the probes' own cost; where a function is fast enough for that to
matter, latency measures it (on a function of its own that does nothing,
in a helper process) and says when it is most of a function's time.

On Linux 6.13+ each function gets a uprobe session: one program run at entry
and return, with the start time kept by the kernel. Elsewhere, and on Go
programs, an entry and a return probe each: the start time waits in a map
under the frame (the stack pointer, or for Go the goroutine and the depth
in its stack), so that recursion, threads and goroutines are timed right;
returns whose entry was not seen (calls already running at attach) are
counted as unmatched.`,
		examples: []string{
			"latency 'uprobe:libc:getaddrinfo,_nss_*' -- getent ahosts localhost",
			"latency --top 5 'uprobe:/bin/bash:*' -- bash -c 'for i in 1 2 3; do echo $i; done'",
			"latency --pid 1234 --duration 10 --json 'uprobe:/usr/sbin/nginx:ngx_http_*'",
		},
		run: runLatency,
	}
}

// latencySlots is the number of a latency.Histogram's slots: slot i counts
// durations in [2^i, 2^(i+1)) ns, the last also longer ones.
const latencySlots = latency.Slots

// latencyFunction is one function's row of the report.
type latencyFunction struct {
	// Probe is the index of the function's probe spec in
	// latencyReport.Probes.
	Probe    int    `json:"probe"`
	Function string `json:"function"`
	Path     string `json:"path"`
	Offset   uint64 `json:"offset"`
	Calls    uint64 `json:"calls"`
	TotalNS  uint64 `json:"total_ns"`
	AvgNS    uint64 `json:"avg_ns"`
	// Buckets run from the first non-empty slot to the last; each holds
	// the calls that took from LowNS up to, not including, HighNS (0 for
	// no bound).
	Buckets []latencyBucket `json:"buckets"`
	// Who made the calls, with --by pid or container.
	caller
}

type latencyBucket struct {
	LowNS  uint64 `json:"low_ns"`
	HighNS uint64 `json:"high_ns"`
	Count  uint64 `json:"count"`
}

type latencyReport struct {
	// Probes are the probe specs as given, which rows name by index.
	Probes []string `json:"probes"`
	Kernel string   `json:"kernel"`
	Path   string   `json:"path"`
	// Mode is "session" (uprobe sessions) or "pairs" (entry and return
	// probes).
	Mode      string        `json:"mode"`
	Functions int           `json:"functions"`
	Called    int           `json:"called"`
	Duration  time.Duration `json:"duration_ns"`
	// Unmatched are returns whose entry was not seen, in pairs mode.
	Unmatched uint64 `json:"unmatched"`
	// Latencies are the functions called, the most total time first: all
	// of them, or the first --top. Never null.
	Latencies []latencyFunction `json:"latencies"`
	Omitted   int               `json:"omitted,omitempty"`
	// Files are the files attached when latency followed every process
	// (no command, no --pid).
	Files []fileEntry `json:"files,omitempty"`
	// LeftOut are the sites the globs selected that are not timed, and
	// why (see countReport.LeftOut): a return probe's as well as an
	// entry's.
	LeftOut []leftOutSite `json:"left_out,omitempty"`
	// ProbeCostNS is what the probes add to each timed call on this
	// machine, as measured (see probeCost), where a function's time is
	// short enough for it to matter; 0 where not measured.
	ProbeCostNS uint64 `json:"probe_cost_ns,omitempty"`
	// By is --by; Unattributed the calls --by pid or container had no
	// room to attribute (they are in the functions' totals elsewhere).
	By           byFlag `json:"by,omitempty"`
	Unattributed uint64 `json:"unattributed,omitempty"`
}

func runLatency(args []string, stdout, stderr io.Writer) error {
	rawStdout, rawStderr := stdout, stderr
	stdout, stderr = &syncWriter{w: stdout}, &syncWriter{w: stderr}
	fs := newFlagSet("latency")
	var tf traceFlags
	tf.register(fs, "functions with the most total time")
	specs, command, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if err := tf.check(specs, command); err != nil {
		return err
	}
	probes, err := multiprobe.ParseProbes(specs...)
	if err != nil {
		return usagef("%v", err)
	}
	for _, p := range probes {
		if p.Kind != multiprobe.Entry {
			return usagef("%s: latency times functions from their entry: give uprobe:TARGET:PATTERN", p)
		}
	}
	tr, err := newTracer(&tf, command, rawStdout, rawStderr, stdout, stderr)
	if err != nil {
		return err
	}
	defer tr.close()
	if tf.following(command) {
		return runLatencyFollow(&tf, probes, tr, stdout, stderr)
	}

	plan, session, err := resolveLatency(probes, tr.opts)
	if err != nil {
		return err
	}
	defer plan.Close()
	lt, err := newLatencyTimer(plan, session, tf.by)
	if err != nil {
		return err
	}
	defer lt.tm.Close()
	end, err := tr.run(plan, lt.tm.Program(), stderr)
	if err != nil {
		return err
	}
	report, err := lt.report(end.elapsed, tf.by)
	if err != nil {
		return err
	}
	report.Kernel, report.Path = tr.features.Release, tr.features.Path().String()
	report.LeftOut = leftOut(plan.LeftOut(), end.leftOut)
	return writeLatencyReport(stdout, &tf, &report, end, tr.opts)
}

// writeLatencyReport keeps the --top rows of report and writes it, as
// JSON with --json; it returns the exit status of end.
func writeLatencyReport(stdout io.Writer, tf *traceFlags, report *latencyReport, end countEnd, opts *multiprobe.Options) error {
	if tf.top > 0 && len(report.Latencies) > tf.top {
		report.Omitted = len(report.Latencies) - tf.top
		report.Latencies = report.Latencies[:tf.top]
	}
	report.measureProbeCost(opts)
	if tf.asJSON {
		if err := writeJSON(stdout, report); err != nil {
			return err
		}
		return end.status()
	}
	writeLatency(stdout, report, tf.verbose)
	return end.status()
}

// resolveLatency resolves the probes as package latency does: uprobe
// sessions where the kernel has them, else an entry and a return probe
// each (a Go program's functions are never sessions: the kernel's return
// probe breaks Go's stack walker).
func resolveLatency(probes []multiprobe.Probe, opts *multiprobe.Options) (plan *multiprobe.Plan, session bool, err error) {
	lp, err := latency.Resolve(probes, opts)
	if err != nil {
		return nil, false, err
	}
	return lp.Plan, lp.Session, nil
}

// followFuncs is how many functions a following latency has histograms
// for (5.5 MiB of them).
const followFuncs = 1 << 14

// runLatencyFollow is latency with no command and no --pid: every
// process's files that the probes' targets match, now and as they appear,
// each function timed by an entry and a return probe (sessions would
// leave Go programs out). A function of one name and probe is one row
// over every file.
func runLatencyFollow(tf *traceFlags, probes []multiprobe.Probe, tr *tracer, stdout, stderr io.Writer) error {
	if err := checkTargets(probes, tr.opts, stderr); err != nil {
		return err
	}
	if err := knownRegisters("latency"); err != nil {
		return err
	}
	tm, err := latency.NewForWatch(tr.opts, &latency.Options{By: countBy(tf.by), MaxBy: maxByHists, Functions: followFuncs, Cookies: followSlots, PerFile: tf.by == byFile})
	if err != nil {
		return err
	}
	defer tm.Close()
	lt := &latencyTimer{tm: tm}
	// Each file's sites are filled in before it is attached.
	fw, err := newFollower(stderr, tf.verbose, tm.Fill).follow(latency.Pairs(probes), tm.Spec(), tm.Program(), *tr.opts, time.Duration(tf.duration))
	if err != nil {
		return err
	}
	report, err := lt.report(fw.end.elapsed, tf.by)
	if err != nil {
		return err
	}
	report.Kernel, report.Path = tr.features.Release, tr.features.Path().String()
	report.Files = fw.files
	report.LeftOut = leftOut(fw.leftOut)
	if err := writeLatencyReport(stdout, tf, &report, fw.end, tr.opts); err != nil {
		return err
	}
	return fw.done(probes, stderr)
}

// latencyTimer is package latency's timer, as the report reads it.
type latencyTimer struct {
	tm *latency.Timer
}

// newLatencyTimer loads package latency's timer for the plan.
func newLatencyTimer(plan *multiprobe.Plan, session bool, by byFlag) (*latencyTimer, error) {
	if err := knownRegisters("latency"); err != nil {
		return nil, err
	}
	tm, err := latency.New(&latency.Plan{Plan: plan, Session: session}, &latency.Options{By: countBy(by), MaxBy: maxByHists})
	if err != nil {
		return nil, err
	}
	return &latencyTimer{tm: tm}, nil
}

// report reads the histograms.
func (lt *latencyTimer) report(elapsed time.Duration, by byFlag) (latencyReport, error) {
	r := latencyReport{Mode: "pairs", Duration: elapsed, Latencies: []latencyFunction{}, By: by}
	if lt.tm.Session() {
		r.Mode = "session"
	}
	snap, err := lt.tm.Snapshot()
	if err != nil {
		return r, err
	}
	r.Functions = len(snap.Functions)
	r.Unmatched = snap.Unmatched
	// Each probe once by its spec, however many files a follow run
	// resolved it in (each file's sites have a Probe of their own).
	probeIndex := map[*multiprobe.Probe]int{}
	bySpec := map[string]int{}
	r.Probes = []string{}
	for _, f := range snap.Functions {
		if _, ok := probeIndex[f.Site.Probe]; !ok {
			spec := f.Site.Probe.String()
			i, ok := bySpec[spec]
			if !ok {
				i = len(r.Probes)
				bySpec[spec] = i
				r.Probes = append(r.Probes, spec)
			}
			probeIndex[f.Site.Probe] = i
		}
	}
	row := func(s multiprobe.Site, h *latency.Histogram) latencyFunction {
		return latencyFunction{
			Probe: probeIndex[s.Probe], Function: s.Label(), Path: s.Path, Offset: s.Offset,
			Calls: h.Count, TotalNS: h.SumNs, AvgNS: h.SumNs / h.Count, Buckets: buckets(h),
		}
	}
	for _, f := range snap.Functions {
		if f.Count == 0 {
			continue
		}
		r.Called++
		r.Latencies = append(r.Latencies, row(f.Site, &f.Histogram))
	}
	if by == byPID || by == byContainer {
		cg := cgroupPaths{}
		rows := []latencyFunction{}
		for _, b := range snap.By {
			l := row(snap.Functions[b.Function].Site, &b.Histogram)
			l.caller = cg.caller(by, b.Who)
			rows = append(rows, l)
		}
		r.Latencies, r.Unattributed = rows, snap.Unattributed
	}
	slices.SortStableFunc(r.Latencies, func(a, b latencyFunction) int {
		return cmp.Or(cmp.Compare(b.TotalNS, a.TotalNS), cmp.Compare(a.Function, b.Function), cmp.Compare(a.PID, b.PID), cmp.Compare(a.Cgroup, b.Cgroup))
	})
	return r, nil
}

// buckets returns h's slots from the first non-empty one to the last.
func buckets(h *latency.Histogram) []latencyBucket {
	first, last := -1, -1
	for i, n := range h.Slots {
		if n > 0 {
			if first < 0 {
				first = i
			}
			last = i
		}
	}
	var out []latencyBucket
	for i := first; i >= 0 && i <= last; i++ {
		b := latencyBucket{LowNS: 1 << i, HighNS: 1 << (i + 1), Count: h.Slots[i]}
		if i == 0 {
			b.LowNS = 0
		}
		if i == latencySlots-1 {
			b.HighNS = 0
		}
		out = append(out, b)
	}
	return out
}

// histWidth is the width of a histogram's longest bar.
const histWidth = 40

// writeLatency draws the report's histograms, as bcc's funclatency does,
// with the bounds in the unit that suits them.
func writeLatency(w io.Writer, r *latencyReport, verbose bool) {
	for _, f := range r.Latencies {
		name := f.Function
		if who := f.who(r.By, f.Path); who != "" {
			name += "  " + strings.ToLower(string(r.By)) + " " + who
		}
		note := ""
		if r.mostlyProbes(f.medianNS()) {
			note = fmt.Sprintf(" (mostly the probes' own %s a call)", shortDuration(r.ProbeCostNS))
		}
		fmt.Fprintf(w, "%s  %d %s, avg %s, total %s%s\n", name, f.Calls, plural(int(min(f.Calls, 2)), "call", "calls"),
			shortDuration(f.AvgNS), shortDuration(f.TotalNS), note)
		var most uint64
		for _, b := range f.Buckets {
			most = max(most, b.Count)
		}
		countWidth := max(len("COUNT"), len(fmt.Sprint(most)))
		fmt.Fprintf(w, "  %21s  %*s  %s\n", "TIME", countWidth, "COUNT", "DISTRIBUTION")
		for _, b := range f.Buckets {
			high := "..."
			if b.HighNS != 0 {
				high = shortDuration(b.HighNS) + ")"
			}
			bar := int((b.Count*histWidth + most - 1) / most)
			fmt.Fprintf(w, "  [%8s, %-9s  %*d  |%-*s|\n", shortDuration(b.LowNS), high, countWidth, b.Count, histWidth, strings.Repeat("*", bar))
		}
		fmt.Fprintln(w)
	}
	if r.Omitted > 0 {
		fmt.Fprintf(w, "(%d more %s called, left out by --top)\n", r.Omitted, plural(r.Omitted, "function", "functions"))
	}
	fmt.Fprintf(w, "%d of %d %s called in %v (%s, %s)\n", r.Called, r.Functions, plural(r.Functions, "function", "functions"),
		r.Duration.Round(time.Millisecond), r.Path, r.Mode)
	if r.Files != nil {
		fmt.Fprintf(w, "in %d %s, following every process%s\n", len(r.Files), plural(len(r.Files), "file", "files"), namesThem(verbose))
	}
	if r.Unattributed > 0 {
		fmt.Fprintf(w, "%d calls not attributed by %s: the table of %d was full\n", r.Unattributed, r.By, maxByHists)
	}
	if r.ProbeCostNS > 0 {
		fmt.Fprintf(w, "each time includes the probes' own cost, %s a call on this machine (measured on a function that does nothing)\n", shortDuration(r.ProbeCostNS))
	}
	writeLeftOut(w, r.LeftOut)
	if r.Unmatched > 0 {
		fmt.Fprintf(w, "%d %s not timed: %s entry was not seen (a call already running at attach)\n",
			r.Unmatched, plural(int(min(r.Unmatched, 2)), "return was", "returns were"), plural(int(min(r.Unmatched, 2)), "its", "their"))
	}
}

// costMatters is how short a function's typical (median) time must be for
// latency to measure what the probes add to it: a few µs a call, more in a
// VM.
const costMatters = 200 * time.Microsecond

// measureProbeCost measures the probes' own cost a call (probeCost) if a
// function of the report is fast enough for it to matter. A measurement
// that fails leaves it unsaid.
func (r *latencyReport) measureProbeCost(opts *multiprobe.Options) {
	if !slices.ContainsFunc(r.Latencies, func(f latencyFunction) bool { return time.Duration(f.medianNS()) < costMatters }) {
		return
	}
	if cost, err := probeCost(opts); err == nil {
		r.ProbeCostNS = uint64(cost)
	}
}

// mostlyProbes reports whether most of a typical call's time, median ns,
// is the probes' own cost.
func (r *latencyReport) mostlyProbes(median uint64) bool {
	return r.ProbeCostNS > 0 && median < 2*r.ProbeCostNS
}

// medianNS estimates the median time of f's calls from its histogram,
// linearly within the bucket that holds it. The median, not the mean,
// says what a call typically costs: one slow call (the first, which
// faults pages in and sets up the return probes' area) can outweigh many
// fast ones in a mean.
func (f *latencyFunction) medianNS() uint64 {
	if f.Calls == 0 {
		return 0
	}
	rank := (f.Calls + 1) / 2
	var below uint64
	for _, b := range f.Buckets {
		if below+b.Count < rank {
			below += b.Count
			continue
		}
		if b.HighNS == 0 {
			return b.LowNS
		}
		frac := (float64(rank-below) - 0.5) / float64(b.Count)
		return b.LowNS + uint64(frac*float64(b.HighNS-b.LowNS))
	}
	return f.AvgNS
}

// shortDuration formats ns in three significant digits or fewer, in ASCII:
// 512ns, 1.05us, 16.8ms, 2.15s.
func shortDuration(ns uint64) string {
	units := []struct {
		name string
		div  float64
	}{{"s", 1e9}, {"ms", 1e6}, {"us", 1e3}}
	for _, u := range units {
		if float64(ns) >= u.div {
			v := float64(ns) / u.div
			switch {
			case v >= 100:
				return fmt.Sprintf("%.0f%s", v, u.name)
			case v >= 10:
				return fmt.Sprintf("%.1f%s", v, u.name)
			}
			return fmt.Sprintf("%.2f%s", v, u.name)
		}
	}
	return fmt.Sprintf("%dns", ns)
}
