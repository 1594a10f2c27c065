package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"time"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/internal/stopped"
)

// calibrateEnv makes multiprobe run as the helper whose calls latency
// times to measure what the probes cost a call (see probeCost).
const calibrateEnv = "MULTIPROBE_CALIBRATE"

// calibrationCalls is how many calls the helper makes.
const calibrationCalls = 500

// calibrationTarget does nothing, in a call of its own: its time between
// entry and return probes is theirs.
//
//go:noinline
func calibrationTarget(i int) int { return i + 1 }

// runCalibration is the helper: it waits for a line, makes the calls and
// exits.
func runCalibration() {
	var b [1]byte
	os.Stdin.Read(b[:])
	n := 0
	for i := range calibrationCalls {
		n += calibrationTarget(i)
	}
	os.Exit(n & 0)
}

// probeCost measures what the probes add to each timed call on this
// machine: latency's program timing calibrationTarget in a helper
// process (this program, started again), which does nothing between
// its entry and return probes; the median of its calls. It is measured in
// a child, never in this process, and only when a report needs it.
func probeCost(opts *multiprobe.Options) (time.Duration, error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), calibrateEnv+"=1")
	in, err := cmd.StdinPipe()
	if err != nil {
		return 0, err
	}
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	p, err := stopped.Start(cmd)
	if err != nil {
		return 0, err
	}
	defer p.Kill()
	o := *opts
	o.PID, o.PIDs, o.Descendants, o.Progress = p.PID(), nil, false, nil
	probes, err := multiprobe.ParseProbes("uprobe:" + exe + ":*.calibrationTarget")
	if err != nil {
		return 0, err
	}
	plan, session, err := resolveLatency(probes, &o)
	if err != nil {
		return 0, err
	}
	defer plan.Close()
	lt, err := newLatencyTimer(plan, session, byNone)
	if err != nil {
		return 0, err
	}
	defer lt.tm.Close()
	l, err := plan.Attach(lt.tm.Program())
	if err != nil {
		return 0, err
	}
	defer l.Close()
	if err := p.Resume(); err != nil {
		return 0, err
	}
	in.Write([]byte("\n"))
	in.Close()
	if _, err := p.Wait(); err != nil {
		return 0, err
	}
	r, err := lt.report(0, byNone)
	if err != nil {
		return 0, err
	}
	if len(r.Latencies) != 1 || r.Latencies[0].Calls == 0 {
		return 0, fmt.Errorf("latency: calibrating: %d of %d calls timed", len(r.Latencies), calibrationCalls)
	}
	return time.Duration(r.Latencies[0].medianNS()), nil
}
