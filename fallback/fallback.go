package fallback

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/multiprobe/multiprobe/internal/fds"
	"github.com/multiprobe/multiprobe/internal/target"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"golang.org/x/sys/unix"
)

// ErrRefCtrUnsupported: a target has ref-counter offsets, but the kernel's
// perf-event uprobes cannot take one (before Linux 4.20, or without the
// uprobe PMU). It wraps ebpf.ErrNotSupported.
var ErrRefCtrUnsupported = target.Unsupported("kernel's perf-event uprobes take no ref-counter offset (Linux 4.20+)")

// Target is one binary and the sites to probe in it, as package attach
// takes it.
type Target = target.Target

// Refusal is a site the kernel refused, which a Link made with
// Options.LeaveOutRefused left out, as package attach reports it.
type Refusal = target.Refusal

// Options change how Uprobes attaches. The zero value, like a nil *Options,
// attaches entry probes with the detected kernel features.
type Options struct {
	// Return attaches return probes (uretprobes) instead of entry probes.
	Return bool
	// Features, if not nil, is used instead of kernelprobe.Detect().
	Features *kernelprobe.Features
	// Programs, if not nil, holds one program per site, in the order of
	// the targets and their offsets, attached instead of prog. Kernels
	// without BPF cookies (before Linux 5.15) tell sites apart this way:
	// each site gets a clone of the program with its cookie built in
	// (see the root package's Plan.Attach).
	Programs []*ebpf.Program
	// Progress, if not nil, is told how many sites are attached, and later
	// detached by Link.Close, as it goes: about ten times a second and
	// once at the end of each phase (PhaseAttach, PhaseDetach), from a
	// goroutine of its own, never concurrently with itself. Attaching
	// 1,000 sites here takes about a minute.
	Progress func(phase string, done, total int)
	// LeaveOutRefused attaches the other sites when the kernel refuses
	// some for reasons of their own (see attach.Options.LeaveOutRefused),
	// up to attach.MaxRefusals (256) of them; Link.Refused says which and why.
	// With Programs, a site left out leaves its program unused.
	LeaveOutRefused bool
}

// Link is the set of per-site perf-event uprobes made by one call of
// [Uprobes]. It is safe for concurrent use. Keep it referenced for as long
// as the probes should stay: like cilium/ebpf's links, whose file
// descriptors it holds, the sites are detached when the garbage collector
// finds it unreachable.
type Link struct {
	mu      sync.Mutex
	targets target.Targets
	links   []link.Link // one per site, in site order; nil after Close
	fds     int
	refused []target.Refusal
	closed  bool
	// progress is Options.Progress, for Close.
	progress func(phase string, done, total int)
}

// Uprobes attaches prog to every site of targets through one perf-event
// uprobe (and BPF perf link) per site, all or nothing: if a site fails, the
// sites already attached are detached before the error returns. It is the
// path for kernels without uprobe_multi (before Linux 6.6) and takes the
// same targets as attach.UprobeMulti, with the same default cookies (a
// site's index over all targets), ref-counter offsets, checks and errors
// (attach.ErrInvalidTarget, target.ErrWrongProgram, fs.ErrNotExist, the
// kernel's errno).
//
// The perf events fire for every process: perf_event_open's pid selects
// one thread, not a process, so it would miss the target's other threads
// (every Go program has several). Filter by pid inside BPF (package
// pidfilter).
//
// prog must be a kprobe program loaded for this path, that is without the
// uprobe_multi expected attach type (see kernelprobe.PrepareProgramSpec).
//
// Every site costs one or two file descriptors (a perf event and, from
// Linux 5.15, a link). Uprobes checks the budget first: it raises the soft
// RLIMIT_NOFILE up to the hard limit if needed, and otherwise fails with an
// error wrapping ErrFDBudget that says how many are needed.
//
// Uprobes keeps the targets' slices, as Link.Targets reports them: do not
// modify them while the link is open.
func Uprobes(prog *ebpf.Program, targets []Target, opts *Options) (*Link, error) {
	if opts == nil {
		opts = &Options{}
	}
	if opts.Programs == nil {
		if err := checkType(prog); err != nil {
			return nil, err
		}
	}
	f := opts.Features
	if f == nil {
		d, err := kernelprobe.Detect()
		if err != nil {
			return nil, fmt.Errorf("fallback: %w", err)
		}
		f = &d
	}

	ts, err := target.Prepare("fallback", targets)
	if err != nil {
		return nil, err
	}
	sites := ts.Sites()
	if opts.Programs != nil {
		if len(opts.Programs) != sites {
			return nil, fmt.Errorf("fallback: %d programs for %d sites (want one per site): %w", len(opts.Programs), sites, target.ErrInvalidOptions)
		}
		for _, p := range opts.Programs {
			if err := checkType(p); err != nil {
				return nil, err
			}
		}
	}
	if !f.RefCtrOffset {
		for _, t := range ts {
			if slices.ContainsFunc(t.RefCtrOffsets, func(o uint64) bool { return o != 0 }) {
				return nil, fmt.Errorf("fallback: %s: kernel %s: %w; drop the ref-counter offsets (USDT semaphores stay 0, so guarded probes do not fire)",
					t.Path, f.Release, ErrRefCtrUnsupported)
			}
		}
	}
	if err := fds.Ensure(2*sites, fmt.Sprintf("%d per-site uprobes", sites)); err != nil {
		return nil, fmt.Errorf("fallback: %w", err)
	}

	l := &Link{targets: ts, links: make([]link.Link, 0, sites), progress: opts.Progress}
	prog0 := startProgress(opts.Progress, PhaseAttach, sites)
	defer prog0.end()
	// The attach phase's reports end before Close's detach ones start.
	abort := func(err error) error {
		prog0.end()
		return l.abort(err)
	}
	site := 0
	var attached target.Targets // ts less the sites refused
	for ti := range ts {
		t := &ts[ti]
		var drop []int
		ex, err := link.OpenExecutable(t.KernelPath())
		if err != nil {
			return nil, abort(fmt.Errorf("fallback: %s%s: %w", target.Of(ti, len(ts)), t.Path, err))
		}
		for j, off := range t.Offsets {
			uo := &link.UprobeOptions{
				// Address bypasses cilium's symbol lookup and is used as
				// the file offset itself; Offset would be added to it.
				Address: off,
				// 0: see above on pids.
				PID: 0,
			}
			if t.RefCtrOffsets != nil {
				uo.RefCtrOffset = t.RefCtrOffsets[j]
			}
			if f.Cookies {
				uo.Cookie = t.Cookies[j]
			}
			p := prog
			if opts.Programs != nil {
				p = opts.Programs[site]
			}
			site++
			var lk link.Link
			if opts.Return {
				lk, err = ex.Uretprobe("", p, uo)
			} else {
				lk, err = ex.Uprobe("", p, uo)
			}
			if err != nil {
				if errno, ok := refused(err); ok && opts.LeaveOutRefused && len(l.refused) < target.MaxRefusals {
					l.refused = append(l.refused, target.Refusal{Target: ti, Site: j, Offset: off, Err: target.Why(errno, t, j)})
					drop = append(drop, j)
					prog0.add(1)
					continue
				}
				return nil, abort(explain(err, p, t, ti, len(ts), j, opts.Return))
			}
			l.links = append(l.links, lk)
			l.fds += fdsOf(lk)
			prog0.add(1)
		}
		if len(drop) < len(t.Offsets) {
			attached = append(attached, t.Without(drop))
		}
	}
	if len(attached) == 0 {
		return nil, abort(fmt.Errorf("fallback: %s: the kernel refused every site: %w", kindOf(opts.Return), target.JoinRefusals(targets, l.refused)))
	}
	if len(l.refused) > 0 {
		l.targets = attached
	}
	return l, nil
}

// refused reports whether err, a site's failed attach, is the kernel
// refusing that site (target.Refusable), and its errno: not a program
// that does not fit a perf-event link, which cilium/ebpf reports as a
// "bpf perf link" error.
func refused(err error) (unix.Errno, bool) {
	var errno unix.Errno
	if !errors.As(err, &errno) || !target.Refusable(errno) || strings.Contains(err.Error(), "bpf perf link") {
		return 0, false
	}
	return errno, true
}

func kindOf(ret bool) string {
	if ret {
		return "uretprobe"
	}
	return "uprobe"
}

// Refused returns the sites the kernel refused and the link left out
// (Options.LeaveOutRefused), in the order of the targets and their sites;
// Target and Site index the targets as given to Uprobes.
func (l *Link) Refused() []Refusal { return slices.Clone(l.refused) }

// abort closes what l holds and returns err with any close error joined.
func (l *Link) abort(err error) error {
	if cerr := l.Close(); cerr != nil {
		err = errors.Join(err, fmt.Errorf("fallback: detaching the sites already attached: %w", cerr))
	}
	return err
}

// fdsOf is the number of descriptors a cilium perf-event link holds: the
// perf event, plus the BPF link where the kernel has perf links (5.15).
func fdsOf(lk link.Link) int {
	if _, ok := lk.(interface{ FD() int }); ok {
		return 2
	}
	return 1
}

// checkType refuses what cannot be a uprobe program.
func checkType(prog *ebpf.Program) error {
	if prog == nil {
		return fmt.Errorf("fallback: nil program: %w", target.ErrWrongProgram)
	}
	if prog.Type() != ebpf.Kprobe {
		return fmt.Errorf("fallback: program %v has type %v; uprobes need a Kprobe program: %w", prog, prog.Type(), target.ErrWrongProgram)
	}
	if prog.FD() < 0 {
		return fmt.Errorf("fallback: program %v is closed: %w", prog, target.ErrWrongProgram)
	}
	return nil
}

// explain wraps the error of one site's attachment with the binary, the
// site and a hint. cilium/ebpf's errors keep the kernel's errno.
func explain(err error, prog *ebpf.Program, t *Target, ti, n, j int, ret bool) error {
	where := fmt.Sprintf("fallback: %s on %s (%ssite %s)", kindOf(ret), t.Path, target.Of(ti, n), target.SiteName(t, j))
	switch {
	case errors.Is(err, os.ErrPermission):
		return fmt.Errorf("%s: %w (needs CAP_BPF and CAP_PERFMON, or root)", where, err)
	case strings.Contains(err.Error(), "bpf perf link") && strings.Contains(err.Error(), unix.EINVAL.Error()):
		// cilium/ebpf drops the errno of BPF_LINK_CREATE (it formats it
		// with %v); EINVAL there means the program's expected attach type
		// does not fit a perf-event link.
		return fmt.Errorf("%s: program %v was not loaded for perf-event uprobes (prepare its spec before loading it: "+
			"plan.Prepare(spec), or without a plan kernelprobe.PrepareProgramSpec(spec, kernelprobe.PathPerfEvent)): %w: %w", where, prog, target.ErrWrongProgram, err)
	case errors.Is(err, unix.EINVAL):
		return fmt.Errorf("%s: the kernel refused the site (offset not at an instruction boundary, "+
			"or a ref-counter offset different from the one already registered there): %w", where, err)
	}
	return fmt.Errorf("%s: %w", where, err)
}

// Close detaches every site and releases the descriptors. It may be called
// more than once; later calls return nil. Detaching a perf-event uprobe
// waits for the kernel, about 0.1 s per site on Linux 6.18, so Close first
// detaches the program from every site at once (after which it no longer
// runs) and then removes the breakpoints, which the kernel serialises:
// about 85 ms per site in all.
//
// If another process holds one of the links open (bpftool, or anything
// that walks the kernel's links by ID), Close still returns only once the
// program is detached, but that process's letting go of the link may be
// what releases the perf event: the kernel then removes that breakpoint,
// and counts down its USDT semaphore, a moment after Close returns.
func (l *Link) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	p := startProgress(l.progress, PhaseDetach, len(l.links))
	err := closeLinks(l.links, p)
	p.end()
	l.links = nil
	l.fds = 0
	return err
}

// Targets returns the targets as attached, with Cookies filled in. The
// slices inside are the Link's own: do not modify them.
func (l *Link) Targets() target.Targets { return slices.Clone(l.targets) }

// Sites returns the number of sites attached, over all targets.
func (l *Link) Sites() int { return l.targets.Sites() }

// Cookies returns every site's cookie, in the order of the targets and their
// offsets.
func (l *Link) Cookies() []uint64 { return l.targets.Cookies() }

// NumFDs returns the number of file descriptors l holds: two per site (perf
// event and BPF link) on kernels with BPF perf links (5.15), one before;
// none after Close.
func (l *Link) NumFDs() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fds
}
