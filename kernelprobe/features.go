package kernelprobe

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/cilium/ebpf"
)

// ForceEnv names the environment variable that switches features off; see
// the package documentation for its words.
const ForceEnv = "MULTIPROBE_FORCE"

// AttachTraceUprobeSession is the kernel's BPF_TRACE_UPROBE_SESSION attach
// type (Linux 6.13), for which cilium/ebpf v0.22 has no named constant.
const AttachTraceUprobeSession ebpf.AttachType = 57

// ErrBadForce is wrapped by the error Detect returns when MULTIPROBE_FORCE
// holds a word it does not know.
var ErrBadForce = errors.New("bad " + ForceEnv + " value")

// Features says what the running kernel supports for user-space probes.
// The zero value supports nothing.
type Features struct {
	// Release is the kernel release, as uname -r prints it.
	Release string
	// UprobeMulti: BPF_LINK_CREATE with BPF_TRACE_UPROBE_MULTI, one link
	// for many sites of one binary (Linux 6.6).
	UprobeMulti bool
	// UprobeMultiPIDFilter: uprobe_multi's pid filter covers every thread
	// of the process (Linux 6.10, commit 46ba0e49b642). Before, it matched
	// one thread id only and silently dropped the other threads' events.
	UprobeMultiPIDFilter bool
	// Cookies: the bpf_get_attach_cookie helper for probe programs, so each
	// site can carry a 64-bit value (Linux 5.15).
	Cookies bool
	// RefCtrOffset: perf-event uprobes accept a ref-counter (USDT semaphore)
	// offset (Linux 4.20). uprobe_multi links always accept one.
	RefCtrOffset bool
	// UprobeSession: BPF_TRACE_UPROBE_SESSION, one program run at a site's
	// entry and at its return (Linux 6.13).
	UprobeSession bool
	// UprobePMU: the "uprobe" perf PMU exists, so perf-event uprobes need no
	// tracefs (Linux 4.17).
	UprobePMU bool
}

// Path is a way of attaching a program to user-space sites.
type Path int

const (
	// PathUprobeMulti attaches all sites of one binary through one
	// uprobe_multi link.
	PathUprobeMulti Path = iota + 1
	// PathPerfEvent attaches every site through its own perf-event uprobe
	// and BPF perf link.
	PathPerfEvent
)

// String returns "uprobe_multi" or "perf_event".
func (p Path) String() string {
	switch p {
	case PathUprobeMulti:
		return "uprobe_multi"
	case PathPerfEvent:
		return "perf_event"
	}
	return fmt.Sprintf("Path(%d)", int(p))
}

// Path returns the attach path these features allow: uprobe_multi where the
// kernel has it, per-site perf events otherwise.
func (f Features) Path() Path {
	if f.UprobeMulti {
		return PathUprobeMulti
	}
	return PathPerfEvent
}

// String lists the features on one line, for logs and error reports.
func (f Features) String() string {
	yes := func(name string, b bool) string {
		if b {
			return name
		}
		return "no-" + name
	}
	return fmt.Sprintf("kernel %s: %s %s %s %s %s %s (path %s)", f.Release,
		yes("uprobe_multi", f.UprobeMulti), yes("pidfilter", f.UprobeMultiPIDFilter),
		yes("cookies", f.Cookies), yes("refctr", f.RefCtrOffset),
		yes("session", f.UprobeSession), yes("pmu", f.UprobePMU), f.Path())
}

// normalize drops what cannot be true without something else: the pid
// filter and sessions are properties of uprobe_multi links, and every
// kernel with uprobe_multi (6.6) has BPF cookies (5.15), so forcing cookies
// off means an older kernel, hence the per-site path, where multiprobe
// keeps the cookies in a map itself.
func (f *Features) normalize() {
	if !f.Cookies {
		f.UprobeMulti = false
	}
	if !f.UprobeMulti {
		f.UprobeMultiPIDFilter = false
		f.UprobeSession = false
	}
}

// detection is the kernel's answer, once there is one. Only a conclusive
// answer is kept: an error (EPERM from a process that gains its
// capabilities later, say) is no fact about the kernel, so the next Detect
// probes again.
type detection struct {
	mu       sync.Mutex
	done     bool
	features Features
}

type parsedForce struct {
	raw   string
	apply func(*Features)
	err   error
}

var (
	detected atomic.Pointer[detection]
	override atomic.Pointer[func(*Features)]
	force    atomic.Pointer[parsedForce]
)

func init() { detected.Store(new(detection)) }

// resetForTest forgets the cached detection so that the next Detect probes
// the kernel again.
func resetForTest() { detected.Store(new(detection)) }

// Detect returns the features of the running kernel. The kernel is probed
// until a probe succeeds, then no more: later calls return the cached
// result with MULTIPROBE_FORCE (read on every call) and any [SetOverride]
// function applied. Safe for concurrent use.
//
// Probing needs CAP_BPF and CAP_PERFMON (or root). On error, the returned
// Features hold what could be found out, at least the release, and the
// next call probes again.
func Detect() (Features, error) {
	d := detected.Load()
	d.mu.Lock()
	f, err := d.features, error(nil)
	if !d.done {
		if f, err = probeAll(); err == nil {
			d.features, d.done = f, true
		}
	}
	d.mu.Unlock()

	pf, ferr := parseForceEnv()
	if ferr != nil {
		return f, ferr
	}
	if pf != nil {
		pf(&f)
	}
	if o := override.Load(); o != nil {
		(*o)(&f)
	}
	f.normalize()
	return f, err
}

// SetOverride installs fn, which Detect applies to every result after
// MULTIPROBE_FORCE, and returns a function that restores the previous
// override. fn nil removes the override. Meant for tests:
//
//	defer kernelprobe.SetOverride(func(f *kernelprobe.Features) { f.UprobeMulti = false })()
//
// The override is process-wide: tests that use it must not run in parallel
// with tests that depend on the detected features.
func SetOverride(fn func(*Features)) (restore func()) {
	var p *func(*Features)
	if fn != nil {
		p = &fn
	}
	prev := override.Swap(p)
	return func() { override.Store(prev) }
}

func parseForceEnv() (func(*Features), error) {
	raw := os.Getenv(ForceEnv)
	if raw == "" {
		return nil, nil
	}
	if pf := force.Load(); pf != nil && pf.raw == raw {
		return pf.apply, pf.err
	}
	apply, err := ParseForce(raw)
	force.Store(&parsedForce{raw: raw, apply: apply, err: err})
	return apply, err
}

var forceWords = map[string]func(*Features){
	"fallback":    func(f *Features) { f.UprobeMulti = false },
	"nopidfilter": func(f *Features) { f.UprobeMultiPIDFilter = false },
	"nocookie":    func(f *Features) { f.Cookies = false },
	"norefctr":    func(f *Features) { f.RefCtrOffset = false },
	"nosession":   func(f *Features) { f.UprobeSession = false },
}

// ParseForce parses a MULTIPROBE_FORCE value (comma-separated words, see the
// package documentation) into a function that switches the named features
// off. An unknown word gives an error wrapping [ErrBadForce].
func ParseForce(s string) (func(*Features), error) {
	var fns []func(*Features)
	for w := range strings.SplitSeq(s, ",") {
		w = strings.TrimSpace(w)
		if w == "" {
			continue
		}
		fn, ok := forceWords[w]
		if !ok {
			return nil, fmt.Errorf("kernelprobe: %s=%q: unknown word %q (want a comma-separated list of fallback, nopidfilter, nocookie, norefctr, nosession): %w",
				ForceEnv, s, w, ErrBadForce)
		}
		fns = append(fns, fn)
	}
	return func(f *Features) {
		for _, fn := range fns {
			fn(f)
		}
		f.normalize()
	}, nil
}
