package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/kernelprobe"
)

func init() {
	commands["count"] = &command{
		usage: "[--pid PID] [--duration D] [--json] [--stats] PROBE... [-- CMD ARGS...]",
		short: "count calls per function through one uprobe_multi link per binary (root)",
		run:   runCount,
	}
}

type countedSite struct {
	Probe    string `json:"probe"`
	Function string `json:"function"`
	Path     string `json:"path"`
	Offset   uint64 `json:"offset"`
	Calls    uint64 `json:"calls"`
}

type countReport struct {
	Kernel   string        `json:"kernel"`
	Path     string        `json:"path"`
	Sites    int           `json:"sites"`
	Called   int           `json:"called"`
	Calls    uint64        `json:"calls"`
	Duration time.Duration `json:"duration_ns"`
	Counts   []countedSite `json:"counts"`
	// Stats are the kernel's run-time statistics for the probe program,
	// with --stats.
	Stats *progStats `json:"stats,omitempty"`
}

type progStats struct {
	Runs      uint64        `json:"runs"`
	Runtime   time.Duration `json:"runtime_ns"`
	PerRunAvg time.Duration `json:"per_run_avg_ns"`
}

func runCount(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("count", stderr)
	pid := fs.Int("pid", 0, "count only calls made by this process")
	duration := fs.Duration("duration", 0, "count for this long (default: until the command exits, or Ctrl-C)")
	asJSON := fs.Bool("json", false, "print JSON")
	stats := fs.Bool("stats", false, "turn on the kernel's BPF run-time statistics and print the cost per hit")
	specs, command, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(specs) == 0 {
		return usagef("need at least one probe, such as uprobe:/bin/bash:sh_*")
	}
	if *pid < 0 {
		return usagef("--pid %d: want a process id", *pid)
	}
	if *pid != 0 && len(command) > 0 {
		return usagef("--pid and a command exclude each other: the command's pid is used")
	}
	probes, err := multiprobe.ParseProbes(specs...)
	if err != nil {
		return usagef("%v", err)
	}
	sites, err := multiprobe.Resolve(probes)
	if err != nil {
		return err
	}
	features, err := kernelprobe.Detect()
	if err != nil {
		return err
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return fmt.Errorf("raising the memlock limit: %w", err)
	}
	spec, err := loadCount()
	if err != nil {
		return err
	}
	kernelprobe.PrepareCollectionSpec(spec, features.Path())
	spec.Maps["counts"].MaxEntries = uint32(len(sites))
	var objs countObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		if errors.Is(err, unix.EPERM) {
			return fmt.Errorf("loading the counter: %w (run as root, or with CAP_BPF and CAP_PERFMON)", err)
		}
		return fmt.Errorf("loading the counter: %w", err)
	}
	defer objs.Close()

	var statsOff io.Closer
	if *stats {
		if statsOff, err = ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME)); err != nil {
			return fmt.Errorf("--stats: enabling BPF run-time statistics: %w", err)
		}
		defer statsOff.Close()
	}

	start := time.Now()
	if len(command) > 0 {
		err = countCommand(objs.CountCall, sites, &features, command, stdout, stderr, *asJSON, *duration)
	} else {
		err = countWhile(objs.CountCall, sites, &features, *pid, *duration, stderr)
	}
	if err != nil {
		return err
	}
	elapsed := time.Since(start)

	report := countReport{Kernel: features.Release, Path: features.Path().String(), Sites: len(sites), Duration: elapsed}
	counts := make([]uint64, len(sites))
	for i := range sites {
		if err := objs.Counts.Lookup(uint32(i), &counts[i]); err != nil {
			return fmt.Errorf("reading count of %s: %w", sites[i].Name, err)
		}
	}
	for i, s := range sites {
		report.Calls += counts[i]
		if counts[i] == 0 {
			continue
		}
		report.Called++
		report.Counts = append(report.Counts, countedSite{
			Probe: s.Probe.String(), Function: s.Name, Path: s.Path, Offset: s.Offset, Calls: counts[i],
		})
	}
	slices.SortStableFunc(report.Counts, func(a, b countedSite) int {
		return cmp.Or(cmp.Compare(b.Calls, a.Calls), cmp.Compare(a.Function, b.Function))
	})
	if *stats {
		st, err := objs.CountCall.Stats()
		if err != nil {
			return fmt.Errorf("--stats: %w", err)
		}
		ps := &progStats{Runs: st.RunCount, Runtime: st.Runtime}
		if ps.Runs > 0 {
			ps.PerRunAvg = ps.Runtime / time.Duration(ps.Runs)
		}
		report.Stats = ps
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(report)
	}
	width := len("CALLS")
	if len(report.Counts) > 0 {
		width = max(width, len(fmt.Sprint(report.Counts[0].Calls)))
	}
	fmt.Fprintf(stdout, "%*s  %s\n", width, "CALLS", "FUNCTION")
	for _, c := range report.Counts {
		fmt.Fprintf(stdout, "%*d  %s\n", width, c.Calls, c.Function)
	}
	fmt.Fprintf(stdout, "%d calls to %d of %d sites in %v (%s)\n",
		report.Calls, report.Called, report.Sites, elapsed.Round(time.Millisecond), features.Path())
	if s := report.Stats; s != nil {
		fmt.Fprintf(stdout, "probe program: %d runs, %v in all, %v per run on average\n", s.Runs, s.Runtime, s.PerRunAvg)
	}
	return nil
}

// countWhile attaches and counts for duration, or until SIGINT or SIGTERM.
func countWhile(prog *ebpf.Program, sites []multiprobe.Site, f *kernelprobe.Features, pid int, duration time.Duration, stderr io.Writer) error {
	l, err := multiprobe.AttachSites(prog, sites, &multiprobe.Options{PID: pid, Features: f})
	if err != nil {
		return err
	}
	defer l.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, duration)
		defer cancel()
	} else {
		fmt.Fprintf(stderr, "counting %d sites; Ctrl-C to stop\n", len(sites))
	}
	<-ctx.Done()
	return nil
}

// countCommand starts the command stopped, attaches with its pid as the
// filter, lets it run and waits for it to exit (or for duration). Starting
// it stopped (under ptrace, until its exec completes) means no call is
// missed between the start and the attach, and no other process's calls
// are counted.
func countCommand(prog *ebpf.Program, sites []multiprobe.Site, f *kernelprobe.Features, command []string, stdout, stderr io.Writer, asJSON bool, duration time.Duration) error {
	// The tracer of a ptrace'd child is the thread that started it.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	cmd := exec.Command(command[0], command[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	if asJSON {
		cmd.Stdout = stderr // keep stdout for the report
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Ptrace: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", command[0], err)
	}
	pid := cmd.Process.Pid
	var ws unix.WaitStatus
	if _, err := unix.Wait4(pid, &ws, 0, nil); err != nil || !ws.Stopped() {
		cmd.Process.Kill()
		cmd.Wait()
		return fmt.Errorf("starting %s: it did not stop after exec (status %v): %v", command[0], ws, err)
	}
	l, err := multiprobe.AttachSites(prog, sites, &multiprobe.Options{PID: pid, Features: f})
	if err != nil {
		cmd.Process.Kill()
		unix.PtraceDetach(pid)
		cmd.Wait()
		return err
	}
	defer l.Close()
	if err := unix.PtraceDetach(pid); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return fmt.Errorf("resuming %s: %w", command[0], err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var timeout <-chan time.Time
	if duration > 0 {
		timeout = time.After(duration)
	}
	select {
	case err := <-done:
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			return fmt.Errorf("waiting for %s: %w", command[0], err)
		}
		if ee != nil {
			fmt.Fprintf(stderr, "%s exited with status %d\n", command[0], ee.ExitCode())
		}
	case <-timeout:
		fmt.Fprintf(stderr, "%s still running after %v; counts so far\n", command[0], duration)
	}
	return nil
}
