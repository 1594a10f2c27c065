package multiprobe

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/multiprobe/multiprobe/attach"
	"github.com/multiprobe/multiprobe/elfsym"
	"github.com/multiprobe/multiprobe/fallback"
	"github.com/multiprobe/multiprobe/internal/target"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/pidfilter"
	"github.com/multiprobe/multiprobe/usdt"
	"golang.org/x/sys/unix"
)

// A Site is one place a probe attaches to: a function, or a USDT probe's
// location.
type Site struct {
	// Name is the function's symbol, or "provider:name" for a USDT site.
	Name string
	// Offset is the file offset the kernel probes.
	Offset uint64
	// Probe is the spec that selected the site, shared by all its sites.
	Probe *Probe
	// Path is the file the probe's target resolved to.
	Path string
	// Cookie is the site's BPF cookie: its index in the sites of the plan,
	// which mp_cookie (bpf/mp_cookie.bpf.h) returns in the program, and
	// mp_usdt_cookie for a USDT site, whose kernel cookie also carries its
	// argument spec id.
	Cookie uint64
	// Moved says why Offset is not where the symbol points, "" if it is:
	// elfsym.MovedGoStackCheck for a Go function, ifunc.Moved for an IFUNC
	// symbol probed at its implementation, or ifunc.NotMoved with the
	// reason an IFUNC's implementation was not found (the resolver is
	// probed).
	Moved string
	// Returns, for a uretprobe spec's site in a Go program, are the file
	// offsets of the function's return instructions, where entry probes
	// stand for the kernel's return probe (which Go's unwinder cannot
	// walk): the program runs there with the site's cookie and the
	// results in their registers (RAX, RBX, ... on x86-64; R0, R1, ... on
	// arm64), where PT_REGS_RC reads the first. Offset is then the
	// function's entry, which is not probed.
	Returns []uint64
	// RefCtrOffset is the file offset of the USDT semaphore that the
	// kernel counts up while the site is attached, 0 for none.
	RefCtrOffset uint64
	// Symbol is the function's symbol, nil for a USDT site.
	Symbol *elfsym.Site
	// USDT is the probe site of a USDT probe, nil for a uprobe.
	USDT *usdt.Site

	args *usdtArgs // a USDT site's decoded arguments
}

// String returns the site as a bpftrace probe names it, with its own name
// for the pattern: "uprobe:/usr/lib/x86_64-linux-gnu/libc.so.6:malloc",
// "usdt:/usr/bin/python3:python:line".
func (s Site) String() string {
	kind := "uprobe"
	if s.Probe != nil {
		kind = s.Probe.Kind.String()
	}
	return kind + ":" + s.Path + ":" + s.Name
}

// Options are given once, to Resolve, and hold for the plan's Prepare and
// Attach. A nil *Options is the zero value.
type Options struct {
	// PID, if not 0, counts only calls made by the process with this pid
	// (all its threads, not its children). The kernel filters where it can
	// (uprobe_multi with the 6.10 fix); elsewhere each Link filters inside
	// BPF with a copy of the program of its own (see Link). A probe's
	// target is looked up in the process's root directory, so that a path
	// or library name means the file a process in a container or chroot
	// sees by that name.
	PID int
	// PIDs, if not empty, counts only calls made by these processes (and
	// PID, if set), through each Link's own in-BPF filter. A Link's set can
	// be changed while attached with Link.SetPIDs.
	PIDs []int
	// Features, if not nil, replaces kernelprobe.Detect(): tests use it to
	// force a path.
	Features *kernelprobe.Features
	// Session attaches the uprobe specs' sites as uprobe sessions (Linux
	// 6.13+): prog, loaded from a SEC("uprobe.session") section, runs at
	// each site's entry and, if it returned 0 there, at the site's return.
	// Sessions exist only on the uprobe_multi path: elsewhere Resolve fails
	// with an error wrapping attach.ErrSessionUnsupported. uretprobe and
	// usdt specs cannot be sessions.
	Session bool
	// IFuncResolvers probes an IFUNC symbol (glibc's strlen, memcpy, ...)
	// where its symbol points: at the resolver, which the loader runs once
	// per process to choose an implementation. By default the site is that
	// implementation, the one this machine's loader chooses, or for a
	// library in a process's root (Options.PID, a container), the one that
	// process's loader chose (see package ifunc and Site.Moved).
	IFuncResolvers bool
	// GoKernelReturns makes a uretprobe spec on a Go program use the
	// kernel's return probe, as on any other binary, and allows sessions
	// there. That crashes the program as soon as its stack grows or is
	// walked (see ErrGoReturn): it is for showing that, not for use. By
	// default a uretprobe spec on a Go program probes each function's
	// return instructions with entry probes (see Site.Returns).
	GoKernelReturns bool
	// Progress, if not nil, is told how a long phase advances: on the
	// perf-event path (before Linux 6.6), where each site costs tens of
	// milliseconds, the sites attached by Attach and detached by
	// Link.Close, per kind (entry or return). It is called about ten times a
	// second and once at the end of each phase, from a goroutine of its
	// own, never concurrently with itself. The uprobe_multi path attaches
	// a binary's sites in one call and reports nothing.
	Progress func(Progress)
}

// Progress is a report of Options.Progress.
type Progress struct {
	// Phase is "attach" or "detach".
	Phase string
	// Path is the binary whose sites these are, or "" for several.
	Path string
	// Done of Total sites are attached, or detached.
	Done, Total int
}

// setup fills in the kernel's features and checks the options.
func (pl *Plan) setup() error {
	if pl.opts.Features != nil {
		pl.features = *pl.opts.Features
	} else {
		f, err := kernelprobe.Detect()
		if err != nil {
			return err
		}
		pl.features = f
	}
	for _, pid := range append([]int{pl.opts.PID}, pl.opts.PIDs...) {
		if err := checkPID(pid); err != nil {
			return err
		}
	}
	if pl.opts.Session && (pl.features.Path() != kernelprobe.PathUprobeMulti || !pl.features.UprobeSession) {
		return fmt.Errorf("multiprobe: kernel %s, %s path: %w; attach entry and return probes instead",
			pl.features.Release, pl.features.Path(), attach.ErrSessionUnsupported)
	}
	return nil
}

// checkSession refuses probes that cannot be sessions: a return probe
// (a session runs at the return already) and a USDT site, which is not a
// function's entry, so the kernel's return probe would take whatever is at
// the stack pointer there for the return address.
func (pl *Plan) checkSession() error {
	if !pl.opts.Session {
		return nil
	}
	for _, pp := range pl.probes {
		if pp.probe.Kind != Entry {
			return fmt.Errorf("%w: %s with Options.Session: only uprobe specs can be sessions", ErrBadSpec, pp.probe)
		}
	}
	return nil
}

// A Link is a program attached to the sites of a plan. It owns what it
// loaded and wrote for them, and Close undoes exactly that, nothing another
// Link holds: its pid filter, its references to USDT argument specs and its
// per-site copies on kernels without BPF cookies (see the package
// documentation for each).
type Link struct {
	plan    *Plan
	prog    *ebpf.Program // as given to Attach
	path    kernelprobe.Path
	links   []*attach.Link   // uprobe_multi path
	perSite []*fallback.Link // perf-event path
	clones  []*ebpf.Program  // the copies of the program the link loaded
	// filtered is the copy with the link's pid filter, for every site,
	// where the kernel has BPF cookies.
	filtered *ebpf.Program
	cloneFDs int           // held by the copies: each program, and its BTF
	specIDs  *usdt.SpecIDs // the USDT sites' argument spec ids

	mu     sync.Mutex
	filter *pidfilter.Filter // the link's own in-BPF pid filter, if it has one
	pids   []int             // what l holds in filter
}

// Attach attaches prog to every site of the plan, all or nothing: on error,
// nothing stays attached. prog must be a kprobe-type program loaded from a
// spec that went through this plan's Prepare (or another plan's with the
// same features). Each site's cookie is its index in Plan.Sites.
//
// Attach finds the maps of the loaded program itself, by their IDs: a copy
// of the program (see Link) shares them, and the USDT argument specs go
// into its mp_usdt_specs. Reading a program's maps needs CAP_SYS_ADMIN. A
// plan that needs a copy and a program whose spec its Prepare did not keep
// is an error wrapping ErrNotPrepared (and ErrNoPIDFilter for a pid
// filter).
//
// On kernels with uprobe_multi (Linux 6.6+) each binary gets one link per
// kind of probe; on older ones, or when Features say so, every site gets
// its own perf-event uprobe (package fallback), with the same cookies.
func (pl *Plan) Attach(prog *ebpf.Program) (_ *Link, err error) {
	if prog == nil {
		return nil, fmt.Errorf("multiprobe: nil program: %w", attach.ErrWrongProgram)
	}
	if prog.FD() < 0 {
		return nil, fmt.Errorf("multiprobe: program %v is closed: %w", prog, attach.ErrWrongProgram)
	}
	for _, of := range pl.files {
		if err := of.changed(); err != nil {
			return nil, err
		}
	}
	l := &Link{plan: pl, path: pl.features.Path(), prog: prog}
	defer func() {
		if err != nil {
			err = errors.Join(err, l.Close())
		}
	}()
	maps, err := programMaps(prog, pl.needsMaps())
	if err != nil {
		return nil, err
	}
	defer maps.close()

	if pids := pl.inBPFPIDs(); pids != nil {
		if l.filter, err = pidfilter.NewFilter(uint32(max(len(pids), pidfilter.DefaultMaxPIDs))); err != nil {
			return nil, fmt.Errorf("multiprobe: %w", err)
		}
		if err := l.filter.Acquire(pids...); err != nil {
			return nil, fmt.Errorf("multiprobe: %w", err)
		}
		l.pids = pids
	}
	usdtCookie, err := l.acquireSpecs(maps)
	if err != nil {
		return nil, err
	}
	// Targets, not Sites: see "Sites and cookies" in the package doc.
	for _, kind := range []Kind{Entry, Return} {
		targets := pl.targets(kind, usdtCookie)
		if len(targets) == 0 {
			continue
		}
		single, perSite, err := l.programsFor(prog, maps, targets)
		if err != nil {
			return nil, err
		}
		if l.path == kernelprobe.PathUprobeMulti {
			al, err := attach.UprobeMulti(single, targets, &attach.Options{
				Return:   kind == Return,
				Session:  pl.opts.Session,
				PID:      pl.kernelPID(),
				Features: &pl.features,
			})
			if err != nil {
				return nil, err
			}
			l.links = append(l.links, al)
			continue
		}
		pl.name(targets)
		fo := &fallback.Options{Return: kind == Return, Features: &pl.features, Programs: perSite}
		if fn := pl.opts.Progress; fn != nil {
			path := ""
			if len(targets) == 1 {
				path = targets[0].Path
			}
			fo.Progress = func(phase string, done, total int) {
				fn(Progress{Phase: phase, Path: path, Done: done, Total: total})
			}
		}
		fl, err := fallback.Uprobes(single, targets, fo)
		if err != nil {
			return nil, err
		}
		l.perSite = append(l.perSite, fl)
	}
	return l, nil
}

// name fills in the names of uprobe sites for the perf-event path's
// messages, where attaching a site costs far more than naming it.
func (pl *Plan) name(targets []target.Target) {
	sites := pl.siteTable()
	names := map[*os.File]map[uint64]string{}
	for i, r := range pl.rows {
		f := pl.probes[r.probe].file.f
		m := names[f]
		if m == nil {
			m = map[uint64]string{}
			names[f] = m
		}
		s := &sites[i]
		m[s.Offset] = s.Name
		for _, off := range s.Returns {
			m[off] = s.Name + " (a return)"
		}
	}
	for i := range targets {
		t := &targets[i]
		m := names[t.File]
		t.Names = make([]string, len(t.Offsets))
		for j, off := range t.Offsets {
			t.Names[j] = m[off]
		}
	}
}

// Sites returns the attached sites, as Plan.Sites does: a copy of its own
// at each call; a site's index is its cookie.
func (l *Link) Sites() []Site { return l.plan.Sites() }

// Path returns the attach path used.
func (l *Link) Path() kernelprobe.Path { return l.path }

// Links returns the underlying uprobe_multi links, for their kernel info;
// none on the perf-event path.
func (l *Link) Links() []*attach.Link { return slices.Clone(l.links) }

// Programs returns the programs attached to the sites: the one given to
// Attach, or the link's copies of it (see Link), whose run-time statistics
// (ebpf.Program.Stats) are where the runs are counted. They are the
// link's: do not close them, and read them before Close.
func (l *Link) Programs() []*ebpf.Program {
	if len(l.clones) > 0 {
		return slices.Clone(l.clones)
	}
	return []*ebpf.Program{l.prog}
}

// Clones returns how many copies of the program the link loaded and holds:
// one per site on a kernel without BPF cookies (before Linux 5.15), for a
// program that reads its cookie with mp_cookie; otherwise one where the
// link filters by pid in BPF, none where it does not.
func (l *Link) Clones() int { return len(l.clones) }

// FDs returns how many file descriptors the link holds: one per binary
// and kind on the uprobe_multi path, one or two per site on the perf-event
// path, one for each copy of the program (see Clones) and one more for its
// BTF if the program has any, two for its own pid filter, and one for its
// handle of the USDT spec table.
func (l *Link) FDs() int {
	n := l.cloneFDs
	for _, al := range l.links {
		n += al.FDs()
	}
	for _, fl := range l.perSite {
		n += fl.FDs()
	}
	if l.filter != nil {
		n += 2 // its two maps
	}
	if l.specIDs != nil {
		n++ // its handle of the USDT spec table
	}
	return n
}

// Close detaches every site, then frees the USDT spec ids and releases
// the pids it holds in the pid filter. It may be called more than once.
func (l *Link) Close() error {
	var errs []error
	for i := len(l.links) - 1; i >= 0; i-- {
		errs = append(errs, l.links[i].Close())
	}
	l.links = nil
	for i := len(l.perSite) - 1; i >= 0; i-- {
		errs = append(errs, l.perSite[i].Close())
	}
	l.perSite = nil
	for _, p := range l.clones {
		errs = append(errs, p.Close())
	}
	l.clones, l.filtered, l.cloneFDs = nil, nil, 0
	if l.specIDs != nil {
		errs = append(errs, l.specIDs.Release())
		l.specIDs = nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.filter != nil {
		errs = append(errs, l.filter.Close())
		l.filter, l.pids = nil, nil
	}
	return errors.Join(errs...)
}

// checkPID fails for a pid that names no process now, so that every path
// reports it the same way: the kernel's pid filter would say ESRCH, the
// in-BPF one would silently count nothing.
func checkPID(pid int) error {
	if pid == 0 {
		return nil
	}
	if pid < 0 || int64(pid) > int64(^uint32(0)>>1) {
		return fmt.Errorf("pid %d: %w", pid, unix.EINVAL)
	}
	if err := unix.Kill(pid, 0); errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("process %d does not exist: %w", pid, err)
	}
	// A zombie or a kernel thread exists but runs no program: it would
	// count nothing, silently. Neither has an executable.
	if _, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe"); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("process %d runs no program (it has exited, or it is a kernel thread): %w", pid, unix.ESRCH)
	}
	return nil
}
