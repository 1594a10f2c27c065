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
	"github.com/multiprobe/multiprobe/attach"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/pidfilter"
	"golang.org/x/sys/unix"
)

var (
	// ErrRefCtrUnsupported: a target has ref-counter offsets, but the kernel's
	// perf-event uprobes cannot take one (before Linux 4.20, or without the
	// uprobe PMU).
	ErrRefCtrUnsupported = errors.New("kernel's perf-event uprobes take no ref-counter offset (Linux 4.20+)")
	// ErrNoPIDFilter: Options.PID was set, but the program carries no
	// in-BPF pid filter (see package pidfilter), so it would run for every
	// process.
	ErrNoPIDFilter = errors.New("program has no injected pid filter")
)

// Options change how Uprobes attaches. The zero value, like a nil *Options,
// attaches entry probes with the detected kernel features.
type Options struct {
	// Return attaches return probes (uretprobes) instead of entry probes.
	Return bool
	// PID, if not 0, is the process the caller means to probe. The perf
	// events still fire for every process: perf_event_open's pid argument
	// selects one thread, not a process, so it would miss the other
	// threads of the target (every Go program has several). The filtering
	// is done inside BPF instead, by a program prepared with
	// pidfilter.Inject whose pid set the caller fills; Uprobes checks that
	// prog has that filter (ErrNoPIDFilter otherwise) but leaves its set
	// alone. PID is also the process whose load addresses turn the sites of
	// position-independent binaries into the addresses CookieMap is keyed
	// by.
	PID int
	// Features, if not nil, is used instead of kernelprobe.Detect().
	Features *kernelprobe.Features
	// CookieMap is the program's loaded address-to-cookie map (named
	// CookieMapName, declared by bpf/cookie.bpf.h). It is needed when the
	// kernel has no BPF cookies (Features.Cookies false, before Linux
	// 5.15): Uprobes then stores every site's cookie under its runtime
	// address, and Close removes them again. It is ignored otherwise.
	CookieMap *ebpf.Map
	// CookiesElsewhere says that the program finds its sites without
	// CookieMap on kernels without BPF cookies (bpf/usdt.bpf.h's own
	// address map, filled by the caller), so none is needed.
	CookiesElsewhere bool
}

// Link is the set of per-site perf-event uprobes made by one call of
// [Uprobes]. It is safe for concurrent use. Keep it referenced for as long
// as the probes should stay: like cilium/ebpf's links, whose file
// descriptors it holds, the sites are detached when the garbage collector
// finds it unreachable.
type Link struct {
	mu      sync.Mutex
	targets attach.Targets
	links   []link.Link // one per site, in site order; nil after Close
	fds     int
	cookies *cookieEntries // nil unless the cookie map was filled
	closed  bool
}

// Uprobes attaches prog to every site of targets through one perf-event
// uprobe (and BPF perf link) per site, all or nothing: if a site fails, the
// sites already attached are detached before the error returns. It is the
// path for kernels without uprobe_multi (before Linux 6.6) and takes the
// same targets as attach.UprobeMulti, with the same default cookies (a
// site's index over all targets), ref-counter offsets, checks and errors
// (attach.ErrInvalidTarget, attach.ErrInvalidOptions,
// attach.ErrWrongProgram, fs.ErrNotExist, the kernel's errno).
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
func Uprobes(prog *ebpf.Program, targets []attach.Target, opts *Options) (*Link, error) {
	if opts == nil {
		opts = &Options{}
	}
	if prog == nil {
		return nil, fmt.Errorf("fallback: nil program: %w", attach.ErrWrongProgram)
	}
	if prog.Type() != ebpf.Kprobe {
		return nil, fmt.Errorf("fallback: program %v has type %v; uprobes need a Kprobe program: %w", prog, prog.Type(), attach.ErrWrongProgram)
	}
	if opts.PID < 0 || int64(opts.PID) > int64(^uint32(0)>>1) {
		return nil, fmt.Errorf("fallback: PID %d: %w", opts.PID, attach.ErrInvalidOptions)
	}
	f := opts.Features
	if f == nil {
		d, err := kernelprobe.Detect()
		if err != nil {
			return nil, fmt.Errorf("fallback: %w", err)
		}
		f = &d
	}

	ts, err := attach.PrepareTargets(targets)
	if err != nil {
		return nil, err
	}
	sites := ts.Sites()
	if !f.RefCtrOffset {
		for _, t := range ts {
			if slices.ContainsFunc(t.RefCtrOffsets, func(o uint64) bool { return o != 0 }) {
				return nil, fmt.Errorf("fallback: %s: kernel %s: %w; drop the ref-counter offsets (USDT semaphores stay 0, so guarded probes do not fire)",
					t.Path, f.Release, ErrRefCtrUnsupported)
			}
		}
	}
	if opts.PID != 0 {
		if err := checkPIDFilter(prog); err != nil {
			return nil, err
		}
	}
	if err := ensureFDs(2 * sites); err != nil {
		return nil, err
	}

	l := &Link{targets: ts, links: make([]link.Link, 0, sites)}
	if !f.Cookies && !opts.CookiesElsewhere {
		if opts.CookieMap == nil {
			return nil, fmt.Errorf("fallback: kernel %s has no BPF cookies: %w", f.Release, ErrNoCookieMap)
		}
		// Filled before any site is attached, so that no event fires
		// without its cookie.
		ce, err := fillCookies(opts.CookieMap, ts, opts.PID)
		if err != nil {
			return nil, err
		}
		l.cookies = ce
	}

	for ti := range ts {
		t := &ts[ti]
		ex, err := link.OpenExecutable(t.Path)
		if err != nil {
			return nil, l.abort(fmt.Errorf("fallback: %s%w", targetOf(ti, len(ts)), err))
		}
		for j, off := range t.Offsets {
			uo := &link.UprobeOptions{
				// Address bypasses cilium's symbol lookup and is used as
				// the file offset itself; Offset would be added to it.
				Address: off,
				// 0, not opts.PID: see Options.PID.
				PID: 0,
			}
			if t.RefCtrOffsets != nil {
				uo.RefCtrOffset = t.RefCtrOffsets[j]
			}
			if f.Cookies {
				uo.Cookie = t.Cookies[j]
			}
			var lk link.Link
			if opts.Return {
				lk, err = ex.Uretprobe("", prog, uo)
			} else {
				lk, err = ex.Uprobe("", prog, uo)
			}
			if err != nil {
				return nil, l.abort(explain(err, prog, t, ti, len(ts), j, opts.Return))
			}
			l.links = append(l.links, lk)
			l.fds += fdsOf(lk)
		}
	}
	return l, nil
}

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

// checkPIDFilter makes sure prog uses a map named pidfilter.MapName, as
// far as this process may look.
func checkPIDFilter(prog *ebpf.Program) error {
	info, err := prog.Info()
	if err != nil {
		return fmt.Errorf("fallback: program %v: %w", prog, err)
	}
	ids, ok := info.MapIDs()
	if !ok {
		return nil // kernel too old to list them (4.15): cannot tell
	}
	for _, id := range ids {
		m, err := ebpf.NewMapFromID(id)
		if err != nil {
			// Opening a map by id needs CAP_SYS_ADMIN, which CAP_BPF
			// alone does not give: cannot tell, so trust the caller.
			return nil
		}
		mi, err := m.Info()
		m.Close()
		if err != nil {
			return nil
		}
		if mi.Name == pidfilter.MapName {
			return nil
		}
	}
	return fmt.Errorf("fallback: program %v uses no map %s; prepare its spec with pidfilter.Inject and add the pid to the filter: %w",
		prog, pidfilter.MapName, ErrNoPIDFilter)
}

// targetOf names target i of n in messages, if there are several.
func targetOf(i, n int) string {
	if n == 1 {
		return ""
	}
	return fmt.Sprintf("target %d of %d, ", i+1, n)
}

// explain wraps the error of one site's attachment with the binary, the
// site and a hint. cilium/ebpf's errors keep the kernel's errno.
func explain(err error, prog *ebpf.Program, t *attach.Target, ti, n, j int, ret bool) error {
	kind := "uprobe"
	if ret {
		kind = "uretprobe"
	}
	where := fmt.Sprintf("fallback: %s on %s (%ssite %s)", kind, t.Path, targetOf(ti, n), attach.SiteName(t, j))
	switch {
	case errors.Is(err, os.ErrPermission):
		return fmt.Errorf("%s: %w (needs CAP_BPF and CAP_PERFMON, or root)", where, err)
	case strings.Contains(err.Error(), "bpf perf link") && strings.Contains(err.Error(), unix.EINVAL.Error()):
		// cilium/ebpf drops the errno of BPF_LINK_CREATE (it formats it
		// with %v); EINVAL there means the program's expected attach type
		// does not fit a perf-event link.
		return fmt.Errorf("%s: program %v was not loaded for perf-event uprobes (load it after "+
			"kernelprobe.PrepareProgramSpec(spec, kernelprobe.PathPerfEvent)): %w: %w", where, prog, attach.ErrWrongProgram, err)
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
func (l *Link) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	err := closeLinks(l.links)
	l.links = nil
	l.fds = 0
	if l.cookies != nil {
		// After the detach, so no event finds its address missing.
		err = errors.Join(err, l.cookies.remove())
		l.cookies = nil
	}
	return err
}

// Targets returns the targets as attached, with Cookies filled in. The
// slices inside are the Link's own: do not modify them.
func (l *Link) Targets() attach.Targets { return slices.Clone(l.targets) }

// Sites returns the number of sites attached, over all targets.
func (l *Link) Sites() int { return l.targets.Sites() }

// Cookies returns every site's cookie, in the order of the targets and their
// offsets.
func (l *Link) Cookies() []uint64 { return l.targets.Cookies() }

// FDs returns the number of file descriptors l holds: two per site (perf
// event and BPF link) on kernels with BPF perf links (5.15), one before;
// none after Close.
func (l *Link) FDs() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fds
}
