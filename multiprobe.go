package multiprobe

import (
	"errors"
	"fmt"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/multiprobe/multiprobe/attach"
	"github.com/multiprobe/multiprobe/elfsym"
	"github.com/multiprobe/multiprobe/fallback"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/pidfilter"
	"github.com/multiprobe/multiprobe/usdt"
	"golang.org/x/sys/unix"
)

// A Site is one function a probe attaches to.
type Site struct {
	// Site is the symbol (for a USDT site: its location, named
	// "provider:name").
	*elfsym.Site
	// Probe is the spec that selected the site, shared by all its sites.
	Probe *Probe
	// Path is the file the probe's target resolved to.
	Path string
	// Cookie is the site's BPF cookie: its index in the sites of the call,
	// which bpf_get_attach_cookie returns in the program (mp_usdt_cookie
	// for a USDT site, whose kernel cookie also carries its spec id).
	Cookie uint64
	// RefCtrOffset is the file offset of the USDT semaphore that the
	// kernel counts up while the site is attached, 0 for none.
	RefCtrOffset uint64
	// USDT is the probe site of a USDT probe (Name is then
	// "provider:name"), nil for a uprobe.
	USDT *usdt.Site

	args *usdtArgs // a USDT site's decoded arguments
}

// usdtArgs are the arguments of a USDT site, or why they cannot be read.
type usdtArgs struct {
	spec usdt.Spec
	err  error
}

// Resolve resolves probes to the sites they select, in the order of the
// probes and, within one, of file offset. A site that two probes of the same
// kind select appears once, for the first: attached twice, its program
// would run twice per call. The cookie of each site is its index.
func Resolve(probes []Probe) ([]Site, error) {
	pl, err := selectProbes(probes)
	if err != nil {
		return nil, err
	}
	return pl.build(), nil
}

// Options change how Attach attaches. A nil *Options is the zero value.
type Options struct {
	// PID, if not 0, counts only calls made by the process with this pid
	// (all its threads, not its children). The kernel filters where it can
	// (uprobe_multi, Linux 6.10+); elsewhere the program must carry the
	// in-BPF filter that Prepare injects.
	PID int
	// PIDs, if not empty, counts only calls made by these processes (and
	// PID, if set), through the in-BPF filter that Prepare injects. The
	// set can be changed while attached with Link.SetPIDs.
	PIDs []int
	// Features, if not nil, replaces kernelprobe.Detect(): tests use it to
	// force a path.
	Features *kernelprobe.Features
	// Maps are the loaded program's maps by name, as in
	// ebpf.Collection.Maps. Attach fills those it knows: the pid filter's
	// (mp_pids), the address-to-cookie map for kernels without BPF cookies
	// (mp_cookies, bpf/cookie.bpf.h) and the USDT argument specs
	// (mp_usdt_specs and mp_usdt_ips, bpf/usdt.bpf.h). USDT sites of a
	// program without mp_usdt_specs attach with plain cookies and no
	// arguments.
	Maps map[string]*ebpf.Map
	// Session attaches the uprobe specs' sites as uprobe sessions (Linux
	// 6.13+): prog, loaded from a SEC("uprobe.session") section, runs at
	// each site's entry and, if it returned 0 there, at the site's return.
	// Sessions exist only on the uprobe_multi path: with the perf-event
	// path, or on an older kernel, Attach fails with an error wrapping
	// attach.ErrSessionUnsupported. uretprobe and usdt specs cannot be
	// sessions.
	Session bool
}

// A Link is a program attached to the sites of a set of probes.
type Link struct {
	sites   []Site
	path    kernelprobe.Path
	links   []*attach.Link   // uprobe_multi path
	perSite []*fallback.Link // perf-event path
	usdt    *usdtState
	filter  *pidfilter.Filter // nil when the kernel filters, or no one does
	pids    []int             // what l put into filter
}

// Attach resolves probes and attaches prog to every site they select, all or
// nothing: on error, nothing stays attached. prog must be a kprobe-type
// program whose spec went through Prepare (or
// kernelprobe.PrepareCollectionSpec, without pid filtering) before it was
// loaded. Each site's cookie is its index in Link.Sites.
func Attach(prog *ebpf.Program, probes []Probe, opts *Options) (*Link, error) {
	pl, err := selectProbes(probes)
	if err != nil {
		return nil, err
	}
	opts, features, err := setup(opts)
	if err != nil {
		return nil, err
	}
	if err := checkSession(opts, func(i int) *Probe { return pl.probes[i].probe }, len(pl.probes)); err != nil {
		return nil, err
	}
	if pl.usdt || features.Path() != kernelprobe.PathUprobeMulti {
		return attachSites(prog, pl.build(), opts, features)
	}
	// The kernel needs only offsets and cookies, which the plan has: hand
	// them over now and build the Sites on another CPU meanwhile. For
	// 100,000 sites the link create is ~75 ms of kernel work and building
	// the Sites ~15 ms, which this hides. The price: an attach error names
	// sites by offset rather than by name.
	built := make(chan []Site, 1)
	go func() { built <- pl.build() }()
	l := &Link{path: features.Path()}
	err = l.attachTargets(prog, opts, features, pl.targets, nil)
	l.sites = <-built
	if err != nil {
		return nil, errors.Join(err, l.Close())
	}
	return l, nil
}

// AttachSites attaches prog to sites that Resolve returned, so that a
// caller can size its maps to the sites before loading prog. Each site's
// cookie is its Cookie field. The Link keeps sites: do not modify them
// afterwards.
//
// On kernels with uprobe_multi (Linux 6.6+) each binary gets one link per
// kind of probe; on older ones, or when Features say so, every site gets
// its own perf-event uprobe (package fallback), with the same cookies.
func AttachSites(prog *ebpf.Program, sites []Site, opts *Options) (*Link, error) {
	if len(sites) == 0 {
		return nil, fmt.Errorf("%w: no sites", ErrBadSpec)
	}
	opts, features, err := setup(opts)
	if err != nil {
		return nil, err
	}
	if err := checkSession(opts, func(i int) *Probe { return sites[i].Probe }, len(sites)); err != nil {
		return nil, err
	}
	return attachSites(prog, sites, opts, features)
}

// setup fills in the defaults of an attach: options, the kernel's features,
// and checked pids.
func setup(opts *Options) (*Options, *kernelprobe.Features, error) {
	if opts == nil {
		opts = &Options{}
	}
	features := opts.Features
	if features == nil {
		f, err := kernelprobe.Detect()
		if err != nil {
			return nil, nil, err
		}
		features = &f
	}
	for _, pid := range append([]int{opts.PID}, opts.PIDs...) {
		if err := checkPID(pid); err != nil {
			return nil, nil, err
		}
	}
	if opts.Session && (features.Path() != kernelprobe.PathUprobeMulti || !features.UprobeSession) {
		return nil, nil, fmt.Errorf("multiprobe: kernel %s, %s path: %w; attach entry and return probes instead",
			features.Release, features.Path(), attach.ErrSessionUnsupported)
	}
	return opts, features, nil
}

// checkSession refuses probes that cannot be sessions: a return probe
// (a session runs at the return already) and a USDT site, which is not a
// function's entry, so the kernel's return probe would take whatever is at
// the stack pointer there for the return address.
func checkSession(opts *Options, probe func(i int) *Probe, n int) error {
	if !opts.Session {
		return nil
	}
	for i := range n {
		if p := probe(i); p.Kind != Entry {
			return fmt.Errorf("%w: %s with Options.Session: only uprobe specs can be sessions", ErrBadSpec, p)
		}
	}
	return nil
}

func attachSites(prog *ebpf.Program, sites []Site, opts *Options, features *kernelprobe.Features) (*Link, error) {
	l := &Link{sites: sites, path: features.Path()}
	cookies, st, err := prepareUSDT(sites, opts, features.Cookies)
	if err != nil {
		return nil, err
	}
	l.usdt = st
	err = l.attachTargets(prog, opts, features, func(kind Kind) []attach.Target {
		return targetsOf(sites, cookies, kind)
	}, func(kind Kind) bool {
		// USDT sites' cookies are in the USDT address map already.
		return st != nil && st.ips != nil && allUSDT(sites, kind)
	})
	if err != nil {
		return nil, errors.Join(err, l.Close())
	}
	return l, nil
}

// attachTargets attaches prog, on the path features choose, to the targets
// of each kind of probe. On error the caller closes l.
func (l *Link) attachTargets(prog *ebpf.Program, opts *Options, features *kernelprobe.Features,
	targetsFor func(Kind) []attach.Target, cookiesElsewhere func(Kind) bool) error {
	kernelPID := opts.PID
	if pids := filterPIDs(features, opts); pids != nil {
		if err := l.filterBy(prog, opts, pids); err != nil {
			return err
		}
		kernelPID = 0
	}
	for _, kind := range []Kind{Entry, Return} {
		targets := targetsFor(kind)
		if len(targets) == 0 {
			continue
		}
		if l.path == kernelprobe.PathUprobeMulti {
			al, err := attach.UprobeMulti(prog, targets, &attach.Options{
				Return:   kind == Return,
				Session:  opts.Session,
				PID:      kernelPID,
				Features: features,
			})
			if err != nil {
				return err
			}
			l.links = append(l.links, al)
			continue
		}
		fl, err := fallback.Uprobes(prog, targets, &fallback.Options{
			Return:           kind == Return,
			PID:              opts.PID,
			Features:         features,
			CookieMap:        opts.Maps[fallback.CookieMapName],
			CookiesElsewhere: cookiesElsewhere != nil && cookiesElsewhere(kind),
		})
		if err != nil {
			return err
		}
		l.perSite = append(l.perSite, fl)
	}
	return nil
}

// targetsOf groups the sites of one kind by binary, with their kernel
// cookies (cookies[i] for sites[i]; their Cookie fields if cookies is nil).
// USDT sites attach as entry probes, with their semaphores as ref-counter
// offsets.
func targetsOf(sites []Site, cookies []uint64, kind Kind) []attach.Target {
	var targets []attach.Target
	index := map[string]int{}
	var sizes []int
	var refCtr []bool
	last := -1 // sites of one binary are adjacent: look its path up once
	for j := range sites {
		s := &sites[j]
		if s.Probe.Kind.attachAs() != kind {
			continue
		}
		if last < 0 || targets[last].Path != s.Path {
			i, ok := index[s.Path]
			if !ok {
				i = len(targets)
				index[s.Path] = i
				targets = append(targets, attach.Target{Path: s.Path})
				sizes, refCtr = append(sizes, 0), append(refCtr, false)
			}
			last = i
		}
		sizes[last]++
		refCtr[last] = refCtr[last] || s.RefCtrOffset != 0
	}
	for i, n := range sizes {
		t := &targets[i]
		t.Offsets, t.Cookies, t.Names = make([]uint64, 0, n), make([]uint64, 0, n), make([]string, 0, n)
		if refCtr[i] {
			t.RefCtrOffsets = make([]uint64, 0, n)
		}
	}
	var t *attach.Target
	for i := range sites {
		s := &sites[i]
		if s.Probe.Kind.attachAs() != kind {
			continue
		}
		if t == nil || t.Path != s.Path {
			t = &targets[index[s.Path]]
		}
		c := s.Cookie
		if cookies != nil {
			c = cookies[i]
		}
		t.Offsets = append(t.Offsets, s.Offset)
		t.Cookies = append(t.Cookies, c)
		t.Names = append(t.Names, s.Name)
		if t.RefCtrOffsets != nil {
			t.RefCtrOffsets = append(t.RefCtrOffsets, s.RefCtrOffset)
		}
	}
	return targets
}

// attachAs is the kind of link a probe's sites attach through: USDT sites
// attach as entry probes.
func (k Kind) attachAs() Kind {
	if k == USDT {
		return Entry
	}
	return k
}

// Sites returns the attached sites; a site's index is its cookie.
func (l *Link) Sites() []Site { return slices.Clone(l.sites) }

// Path returns the attach path used.
func (l *Link) Path() kernelprobe.Path { return l.path }

// Links returns the underlying uprobe_multi links, for their kernel info;
// none on the perf-event path.
func (l *Link) Links() []*attach.Link { return slices.Clone(l.links) }

// FDs returns how many file descriptors the attached sites hold: one per
// binary and kind on the uprobe_multi path, one or two per site on the
// perf-event path.
func (l *Link) FDs() int {
	n := 0
	for _, al := range l.links {
		n += al.FDs()
	}
	for _, fl := range l.perSite {
		n += fl.FDs()
	}
	return n
}

// Close detaches every site, then frees the USDT spec ids and removes the
// pids it put into the pid filter. It may be called more than once.
func (l *Link) Close() error {
	var errs []error
	for i := len(l.links) - 1; i >= 0; i-- {
		errs = append(errs, l.links[i].Close())
	}
	for i := len(l.perSite) - 1; i >= 0; i-- {
		errs = append(errs, l.perSite[i].Close())
	}
	l.usdt.release()
	l.usdt = nil
	if l.filter != nil && len(l.pids) > 0 {
		errs = append(errs, l.filter.Remove(l.pids...))
		l.pids = nil
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
	if pid < 0 {
		return fmt.Errorf("pid %d: %w", pid, unix.EINVAL)
	}
	if err := unix.Kill(pid, 0); errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("process %d does not exist: %w", pid, err)
	}
	return nil
}

// allUSDT reports whether every site of kind is a USDT site.
func allUSDT(sites []Site, kind Kind) bool {
	for _, s := range sites {
		if s.Probe.Kind == kind || (kind == Entry && s.Probe.Kind == USDT) {
			if s.USDT == nil {
				return false
			}
		}
	}
	return true
}
