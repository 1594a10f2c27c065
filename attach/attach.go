package attach

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/multiprobe/multiprobe/internal/bpfsys"
	"github.com/multiprobe/multiprobe/internal/target"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"golang.org/x/sys/unix"
)

// MaxSitesPerLink is the kernel's limit on the sites of one uprobe_multi
// link (MAX_UPROBE_MULTI_CNT; more fail with E2BIG). UprobeMulti splits a
// binary with more sites into several links.
const MaxSitesPerLink = 1 << 20

// sitesPerLink is MaxSitesPerLink, lowered by tests to exercise splitting
// without a million sites.
var sitesPerLink = MaxSitesPerLink

var (
	// ErrUprobeMultiUnsupported: the kernel has no uprobe_multi links
	// (before Linux 6.6). Use the per-site perf-event path instead. Like
	// the other missing-feature errors, it wraps ebpf.ErrNotSupported.
	ErrUprobeMultiUnsupported = target.Unsupported("kernel has no uprobe_multi links (Linux 6.6+)")
	// ErrPIDFilterUnsupported: Options.PID was set, but the kernel's
	// uprobe_multi pid filter matches one thread only (fixed in Linux 6.10).
	ErrPIDFilterUnsupported = target.Unsupported("kernel's uprobe_multi pid filter misses all threads but one (fixed in Linux 6.10)")
	// ErrSessionUnsupported: Options.Session was set on a kernel without
	// uprobe sessions (before Linux 6.13).
	ErrSessionUnsupported = target.Unsupported("kernel has no uprobe sessions (Linux 6.13+)")
	// ErrWrongProgram: the program cannot be attached this way: it is not a
	// kprobe-type program, or it was loaded for the other attach path (its
	// expected attach type is not the one the link needs). Package fallback
	// returns the same error.
	ErrWrongProgram = target.ErrWrongProgram
	// ErrInvalidTarget: a Target is malformed (no path or offsets, slices of
	// different lengths, an offset past the end of the file, an odd
	// ref-counter offset, a path that is not a regular file). Package
	// fallback returns the same error.
	ErrInvalidTarget = target.ErrInvalidTarget
	// ErrInvalidOptions: Options are inconsistent (Session with Return, a
	// negative PID). Package fallback returns the same error.
	ErrInvalidOptions = target.ErrInvalidOptions
)

// Target is one binary and the sites to probe in it; package fallback
// takes the same type.
type Target = target.Target

// Targets is the set of targets of one attach call.
type Targets = target.Targets

// Refusal is a site the kernel refused, which a Link made with
// Options.LeaveOutRefused left out; package fallback reports the same.
type Refusal = target.Refusal

// MaxRefusals is how many refused sites one call leaves out at most.
const MaxRefusals = target.MaxRefusals

// Options change how UprobeMulti attaches. The zero value, like a nil
// *Options, attaches entry probes for all processes with the detected
// kernel features.
type Options struct {
	// Return attaches return probes (uretprobes) instead of entry probes.
	Return bool
	// Session attaches a uprobe session (Linux 6.13): the program runs at
	// entry and, if it returned 0 there, again at return. It must have been
	// loaded with attach type kernelprobe.AttachTraceUprobeSession (section
	// "uprobe.session"). Excludes Return.
	Session bool
	// PID, if not 0, restricts the probes to the process (all its threads,
	// not its children) with this pid, through the kernel's pid filter.
	// Kernels before 6.10 give ErrPIDFilterUnsupported.
	PID int
	// Features, if not nil, is used instead of kernelprobe.Detect().
	Features *kernelprobe.Features
	// LeaveOutRefused attaches the other sites when the kernel refuses
	// some for reasons of their own (EINVAL for another
	// tracer's uprobe at the offset with another ref-counter offset,
	// ENOTSUPP or ENOEXEC for an instruction it will not probe), up to MaxRefusals of them;
	// Link.Refused says which and why. Without it, or past that many, a
	// refused site fails the whole call, naming it. Either way a link
	// has at least one site.
	LeaveOutRefused bool
}

// Link is a set of uprobe_multi links made by one call of UprobeMulti: one
// kernel link per binary (more for a binary with more than MaxSitesPerLink
// sites). It is safe for concurrent use. Keep it referenced for as long as
// the probes should stay: like cilium/ebpf's links, its file descriptors
// are closed, and the sites detached, when the garbage collector finds it
// unreachable.
type Link struct {
	mu      sync.Mutex
	targets Targets
	links   []link.Link // one per kernel link, cilium/ebpf's uprobe_multi type; nil after Close
	ids     []link.ID   // their kernel IDs, for Close to wait on
	spans   []span      // the sites each kernel link covers
	refused []target.Refusal
	closed  bool
}

// Refused returns the sites the kernel refused and the link left out
// (Options.LeaveOutRefused), in the order of the targets and their sites;
// Target and Site index the targets as given to UprobeMulti.
func (l *Link) Refused() []Refusal { return slices.Clone(l.refused) }

type span struct {
	target, first, end int // sites targets[target].Offsets[first:end]
}

// UprobeMulti attaches prog to every site of targets through uprobe_multi
// links, one per target (binary), all or nothing: if a link fails, those
// already made are closed before the error returns. prog must be a kprobe
// program loaded for the uprobe_multi path (see
// kernelprobe.PrepareProgramSpec) or, with Options.Session, for sessions.
// opts may be nil.
//
// Targets are checked before anything is attached; errors wrap
// ErrInvalidTarget, ErrInvalidOptions, ErrWrongProgram, fs.ErrNotExist (a
// missing binary, with its path) or the kernel's errno, and say which binary
// and site failed and what to do.
//
// UprobeMulti keeps the targets' slices, as Link.Targets reports them: do
// not modify them while the link is open. (Copying the offsets, cookies and
// names of 100,000 sites would cost more than deciding them.)
func UprobeMulti(prog *ebpf.Program, targets []Target, opts *Options) (*Link, error) {
	if opts == nil {
		opts = &Options{}
	}
	if prog == nil {
		return nil, fmt.Errorf("attach: nil program: %w", ErrWrongProgram)
	}
	if prog.Type() != ebpf.Kprobe {
		return nil, fmt.Errorf("attach: program %v has type %v; uprobes need a Kprobe program: %w", prog, prog.Type(), ErrWrongProgram)
	}
	if prog.FD() < 0 {
		// The kernel would say EBADF, which checkProgram takes for a
		// path that is not a regular file.
		return nil, fmt.Errorf("attach: program %v is closed: %w", prog, ErrWrongProgram)
	}

	f := opts.Features
	if f == nil {
		d, err := kernelprobe.Detect()
		if err != nil {
			return nil, fmt.Errorf("attach: %w", err)
		}
		f = &d
	}
	if !f.UprobeMulti {
		return nil, fmt.Errorf("attach: kernel %s: %w; attach per site through perf events instead", f.Release, ErrUprobeMultiUnsupported)
	}

	attachType, kind, flags := ebpf.AttachTraceUprobeMulti, "uprobe_multi", uint32(0)
	switch {
	case opts.Session && opts.Return:
		return nil, fmt.Errorf("attach: Session and Return together (a session program already runs at entry and return): %w", ErrInvalidOptions)
	case opts.Session:
		if !f.UprobeSession {
			return nil, fmt.Errorf("attach: kernel %s: %w", f.Release, ErrSessionUnsupported)
		}
		attachType, kind = kernelprobe.AttachTraceUprobeSession, "uprobe session"
	case opts.Return:
		flags = bpfsys.FlagUprobeMultiReturn
	}
	if opts.PID < 0 || int64(opts.PID) > int64(^uint32(0)>>1) {
		return nil, fmt.Errorf("attach: PID %d: %w", opts.PID, ErrInvalidOptions)
	}
	if opts.PID > 0 && !f.UprobeMultiPIDFilter {
		return nil, fmt.Errorf("attach: pid %d on kernel %s: %w; filter by pid inside the BPF program instead", opts.PID, f.Release, ErrPIDFilterUnsupported)
	}

	ts, err := target.Prepare("attach", targets)
	if err != nil {
		return nil, err
	}
	if err := checkProgram(prog, attachType, kind); err != nil {
		return nil, err
	}

	l := &Link{}
	for ti := range ts {
		t := ts[ti]
		// A site left out shifts the sites after it: orig maps t's site
		// index back to the caller's.
		left := 0
		for first, end := 0, 0; first < len(t.Offsets); first = end {
			end = min(first+sitesPerLink, len(t.Offsets))
			req := newRequest(prog, attachType, flags, opts.PID, &t, first, end)
			fd, errno := bpfsys.LinkCreateUprobeMulti(req)
			if errno != 0 && target.Refusable(errno) && opts.LeaveOutRefused {
				// Find the sites refused and try again without
				// them; isolate says !ok where that is not what the
				// kernel refuses (too many sites, or none alone).
				if refused, ok := isolate(req, target.MaxRefusals-len(l.refused)); ok {
					for _, r := range refused {
						j := first + r.at
						l.refused = append(l.refused, target.Refusal{
							Target: ti, Site: j + left, Offset: t.Offsets[j], Err: target.Why(r.errno, &t, j),
						})
					}
					drop := make([]int, len(refused))
					for i, r := range refused {
						drop[i] = first + r.at
					}
					t = t.Without(drop)
					left += len(drop)
					end -= len(drop)
					if first == end {
						continue
					}
					req = newRequest(prog, attachType, flags, opts.PID, &t, first, end)
					fd, errno = bpfsys.LinkCreateUprobeMulti(req)
				}
			}
			if errno != 0 {
				err := explain(errno, kind, &t, target.Of(ti, len(ts)), first, end, opts.PID)
				if errno == errENOTSUPP || errno == unix.ENOEXEC {
					err = fmt.Errorf("%w%s", err, nameRefused(req, &t, first))
				}
				l.targets = append(l.targets, t) // for Close's messages
				if cerr := l.Close(); cerr != nil {
					err = errors.Join(err, fmt.Errorf("attach: closing the links already made: %w", cerr))
				}
				return nil, err
			}
			if err := l.add(fd, span{len(l.targets), first, end}); err != nil {
				l.targets = append(l.targets, t)
				return nil, errors.Join(fmt.Errorf("attach: %s link for %s: %w", kind, t.Path, err), l.Close())
			}
		}
		if len(t.Offsets) > 0 {
			l.targets = append(l.targets, t)
		}
	}
	if len(l.targets) == 0 {
		// Every site was refused: nothing is attached, which is no link.
		return nil, fmt.Errorf("attach: %s link: the kernel refused every site: %w", kind, target.JoinRefusals(targets, l.refused))
	}
	return l, nil
}

// newRequest is the uprobe_multi link of t's sites first to end.
func newRequest(prog *ebpf.Program, attachType ebpf.AttachType, flags uint32, pid int, t *Target, first, end int) bpfsys.UprobeMulti {
	req := bpfsys.UprobeMulti{
		ProgFD:     prog.FD(),
		AttachType: uint32(attachType),
		Path:       t.KernelPath(),
		Offsets:    t.Offsets[first:end],
		Cookies:    t.Cookies[first:end],
		Flags:      flags,
		PID:        uint32(pid),
	}
	if t.RefCtrOffsets != nil {
		req.RefCtrOffsets = t.RefCtrOffsets[first:end]
	}
	return req
}

// checkProgram asks the kernel for a link on "/" with prog. The kernel
// checks the program's expected attach type before it looks at the path,
// so EINVAL means prog was loaded for another attach path and EBADF (a
// directory is not a regular file) means it fits. This is more robust than
// reading the program's info, which does not report the expected attach
// type.
func checkProgram(prog *ebpf.Program, at ebpf.AttachType, kind string) error {
	fd, errno := bpfsys.LinkCreateUprobeMulti(bpfsys.UprobeMulti{
		ProgFD:     prog.FD(),
		AttachType: uint32(at),
		Path:       "/",
		Offsets:    []uint64{0},
	})
	switch errno {
	case unix.EBADF:
		return nil
	case 0:
		unix.Close(fd)
		return fmt.Errorf("attach: the kernel made a %s link on / for program %v, which it should refuse", kind, prog)
	case unix.EINVAL:
		hint := "prepare its spec before loading it: plan.Prepare(spec), or without a plan kernelprobe.PrepareProgramSpec(spec, kernelprobe.PathUprobeMulti)"
		if at == kernelprobe.AttachTraceUprobeSession {
			hint = `load it from a SEC("uprobe.session") section or with AttachType kernelprobe.AttachTraceUprobeSession`
		}
		return fmt.Errorf("attach: program %v was not loaded for %s links (%s): %w: %w", prog, kind, hint, ErrWrongProgram, errno)
	}
	return explainCommon(fmt.Sprintf("attach: checking program %v for %s", prog, kind), errno, 0)
}

// errENOTSUPP is the kernel's internal ENOTSUPP (524), which uprobe
// registration returns for an instruction it cannot probe.
const errENOTSUPP = target.ErrnoENOTSUPP

// refusedSite is a site of a request that the kernel refuses on its own:
// its index in the request, and the errno.
type refusedSite struct {
	at    int
	errno unix.Errno
}

// isolate finds which of req's sites the kernel refuses, by halving them
// into links of a program that does nothing, each closed at once: the
// failed link said only that one was. It gives up (ok false) past max
// sites, or when no site fails alone, which means the kernel refuses
// something else. A site with one refusal costs about 2·log2(n) attempts.
func isolate(req bpfsys.UprobeMulti, max int) (found []refusedSite, ok bool) {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: ebpf.Kprobe, AttachType: ebpf.AttachType(req.AttachType), License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	})
	if err != nil {
		return nil, false
	}
	defer prog.Close()
	req.ProgFD = prog.FD()
	over := false
	var halve func(lo, hi int)
	halve = func(lo, hi int) {
		if over {
			return
		}
		r := req
		r.Offsets = req.Offsets[lo:hi]
		r.Cookies = nil
		if req.RefCtrOffsets != nil {
			r.RefCtrOffsets = req.RefCtrOffsets[lo:hi]
		}
		fd, errno := bpfsys.LinkCreateUprobeMulti(r)
		switch {
		case errno == 0:
			unix.Close(fd)
		case !target.Refusable(errno):
		case hi-lo == 1:
			if len(found) == max {
				over = true
				return
			}
			found = append(found, refusedSite{lo, errno})
		default:
			mid := (lo + hi) / 2
			halve(lo, mid)
			halve(mid, hi)
		}
	}
	halve(0, len(req.Offsets))
	return found, !over && len(found) > 0
}

// nameRefused names the sites of req that the kernel refuses ("; refused:
// #12 (offset 0x8ff70), ..."), the first ten, for an error. first is the
// index of req's first site in its target. The sites that multiprobe
// resolves were checked with kernelprobe.CheckInsn, so a site found here
// is one it did not predict, or the file changed since.
func nameRefused(req bpfsys.UprobeMulti, t *Target, first int) string {
	found, _ := isolate(req, 10)
	if len(found) == 0 {
		return ""
	}
	names := make([]string, len(found))
	for i, r := range found {
		names[i] = target.SiteName(t, first+r.at)
	}
	return "; refused: " + strings.Join(names, ", ")
}

// explain turns the kernel's errno for a failed link into an error that
// names the binary and says what to do.
func explain(errno unix.Errno, kind string, t *Target, which string, first, end, pid int) error {
	where := fmt.Sprintf("attach: %s link for %s (%ssites %s to %s)", kind, t.Path, which, target.SiteName(t, first), target.SiteName(t, end-1))
	if first == 0 && end == len(t.Offsets) {
		sites := "sites"
		if end == 1 {
			sites = "site"
		}
		where = fmt.Sprintf("attach: %s link for %s (%s%d %s)", kind, t.Path, which, end, sites)
	}
	switch errno {
	case unix.EBADF:
		return fmt.Errorf("%s: not a regular file: %w", where, errno)
	case unix.E2BIG:
		return fmt.Errorf("%s: more sites than the kernel allows in one link: %w", where, errno)
	case unix.EINVAL:
		return fmt.Errorf("%s: the kernel refused a site (offset not at an instruction boundary, "+
			"or a ref-counter offset different from the one already registered at that offset): %w", where, errno)
	case errENOTSUPP:
		return fmt.Errorf("%s: the kernel will not place a uprobe at an instruction there (ENOTSUPP, errno 524): %w: %w",
			where, kernelprobe.ErrUnprobeable, errno)
	case unix.ENOEXEC:
		return fmt.Errorf("%s: the kernel's instruction decoder does not know an instruction there: %w: %w",
			where, kernelprobe.ErrUnprobeable, errno)
	}
	return explainCommon(where, errno, pid)
}

func explainCommon(where string, errno unix.Errno, pid int) error {
	switch errno {
	case unix.EPERM, unix.EACCES:
		return fmt.Errorf("%s: %w (needs CAP_BPF and CAP_PERFMON, or root)", where, errno)
	case unix.ESRCH:
		return fmt.Errorf("%s: process %d does not exist: %w", where, pid, errno)
	case unix.ENOENT:
		return fmt.Errorf("%s: file does not exist: %w", where, errno)
	}
	return fmt.Errorf("%s: %w", where, errno)
}

// Close detaches every site and releases the links' file descriptors. A
// kernel link pinned through Links stays attached until its pin is removed.
// Close may be called more than once; later calls return nil. Detaching is the
// slow part of a uprobe's life (tens of milliseconds per thousand sites).
func (l *Link) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	var errs []error
	// A pinned link stays attached: wait only for the others.
	var ids []link.ID
	for i, kl := range l.links {
		if !bpfsys.Pinned(kl) {
			ids = append(ids, l.ids[i])
		}
	}
	defer bpfsys.WaitLinksFreed(ids)
	for i := len(l.links) - 1; i >= 0; i-- {
		if err := l.links[i].Close(); err != nil {
			errs = append(errs, fmt.Errorf("attach: close link for %s: %w", l.targets[l.spans[i].target].Path, err))
		}
	}
	l.links = nil
	return errors.Join(errs...)
}

// Targets returns the targets as attached, with Cookies filled in. The
// slices inside are the Link's own: do not modify them.
func (l *Link) Targets() Targets { return l.targets.Clone() }

// Sites returns the number of sites attached, over all targets.
func (l *Link) Sites() int { return l.targets.Sites() }

// Cookies returns every site's cookie, in the order of the targets and their
// offsets.
func (l *Link) Cookies() []uint64 { return l.targets.Cookies() }

// NumFDs returns the number of kernel links, each one file descriptor, that l
// holds: one per target, more for targets with more than MaxSitesPerLink
// sites, none after Close.
func (l *Link) NumFDs() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.links)
}

// add takes the kernel link fd as a cilium/ebpf link, which gives it Pin,
// Info and the rest of link.Link.
func (l *Link) add(fd int, sp span) error {
	id, errno := bpfsys.LinkID(fd)
	if errno != 0 {
		unix.Close(fd)
		return fmt.Errorf("reading the new link's ID: %w", errno)
	}
	kl, err := link.NewFromFD(fd) // closes fd on error
	if err != nil {
		return err
	}
	l.links = append(l.links, kl)
	l.ids = append(l.ids, id)
	l.spans = append(l.spans, sp)
	return nil
}

// Links returns the kernel links, cilium/ebpf's uprobe_multi links, in the
// order of the targets and their sites, as Info reports them. They are
// l's: read their info or pin them, but do not close them; Close does.
func (l *Link) Links() []link.Link {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.links)
}
