package main

import (
	"flag"
	"io"
	"time"

	"github.com/cilium/ebpf"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/internal/bpfsys"
	"github.com/multiprobe/multiprobe/kernelprobe"
)

// traceFlags are the flags of the commands that attach and run until
// something ends them: count and latency.
type traceFlags struct {
	pid      int
	duration secondsFlag
	top      int
	asJSON   bool
	// verbose prints a line per file attached (and, following every
	// process, skipped or detached).
	verbose bool
	// children counts the command's (or --pid's) descendants too.
	children bool
	// by splits each function's row by who made the calls.
	by byFlag
	// profiling, where a command sets it, profiles the program while it
	// runs (count --profile).
	profiling *profileFlags
}

// register adds the flags to fs; rows names what --top keeps.
func (f *traceFlags) register(fs *flag.FlagSet, rows string) {
	fs.IntVar(&f.pid, "pid", 0, "trace only calls made by the process `PID`")
	fs.IntVar(&f.pid, "p", 0, "short for --pid")
	fs.Var(&f.duration, "duration", "trace for this long: `D` as 10s, 1m30s or 2.5 (seconds) (default: until the command exits, or Ctrl-C)")
	fs.IntVar(&f.top, "top", 0, "show only the first `N` "+rows)
	fs.BoolVar(&f.asJSON, "json", false, "print the report as JSON on stdout; the command after \"--\" then writes its stdout to stderr")
	fs.BoolVar(&f.verbose, "verbose", false, "print a line to stderr for each file attached (its device and inode), and when following every process, skipped or detached")
	fs.BoolVar(&f.verbose, "v", false, "short for --verbose")
	fs.BoolVar(&f.children, "follow-children", false, "count the calls of the command's (or --pid's) descendants too, as strace -f follows them: a child joins as it is made")
	fs.BoolVar(&f.children, "f", false, "short for --follow-children")
	fs.Var(&f.by, "by", "a row for each function and `WHO` made its calls: pid (the process), file (the file the site is in) or container (the caller's cgroup, and the container id it names)")
}

// check refuses flags that make no sense with the probe specs and the
// command after "--".
func (f *traceFlags) check(specs, command []string) error {
	if len(specs) == 0 {
		return usagef("need at least one probe, such as uprobe:/bin/bash:sh_*")
	}
	if f.pid < 0 {
		return usagef("--pid %d: want a process id", f.pid)
	}
	if f.pid != 0 && len(command) > 0 {
		return usagef("--pid and a command exclude each other: the command's pid is used")
	}
	if f.top < 0 {
		return usagef("--top %d: want a positive number of rows", f.top)
	}
	if command != nil && len(command) == 0 {
		return usagef(`"--" with no command after it`)
	}
	if f.children && f.following(command) {
		return usagef("--follow-children follows a command's or --pid's descendants: with neither, every process counts already")
	}
	return nil
}

// A tracer is what count and latency share between parsing their flags and
// attaching: the kernel's features, the plan's options, and the command
// after "--", started stopped so that the probes are attached before it
// makes a call.
type tracer struct {
	flags    *traceFlags
	features kernelprobe.Features
	opts     *multiprobe.Options
	child    *stoppedCommand
}

// newTracer detects the kernel's features and starts the command, if any.
// rawStdout and rawStderr are the CLI's own outputs, stdout and stderr
// their serialised wrappers. The caller must call close.
func newTracer(f *traceFlags, command []string, rawStdout, rawStderr, stdout, stderr io.Writer) (_ *tracer, err error) {
	t := &tracer{flags: f}
	if t.features, err = kernelprobe.Detect(); err != nil {
		return nil, err
	}
	if err := bpfsys.RaiseMemlock(); err != nil {
		return nil, err
	}
	t.opts = &multiprobe.Options{Features: &t.features, PID: f.pid, Descendants: f.children, Progress: terminalProgress(rawStderr)}
	if len(command) == 0 {
		return t, nil
	}
	if t.child, err = startStopped(command, childWriter(rawStdout, stdout), childWriter(rawStderr, stderr), f.asJSON); err != nil {
		return nil, err
	}
	t.opts.PID = t.child.PID()
	return t, nil
}

// run attaches prog to the plan's sites and traces until the command or
// the --pid process exits, --duration passes, or a signal arrives; see
// countUntil.
func (t *tracer) run(plan *multiprobe.Plan, prog *ebpf.Program, stderr io.Writer) (countEnd, error) {
	return countUntil(plan, prog, t.child, t.opts.PID, time.Duration(t.flags.duration), t.flags.profiling, t.flags.verbose, stderr)
}

// close kills the command if it is still there: it never outlives
// multiprobe.
func (t *tracer) close() {
	if t.child != nil {
		t.child.Kill()
	}
}
