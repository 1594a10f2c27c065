package latency

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/count"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/watch"
)

// Slots is how many slots a Histogram has: slot i counts the calls that
// took from 2^i to 2^(i+1) nanoseconds, the last also the longer ones
// (2^39 ns is about nine minutes).
const Slots = len(timerHist{}.Slots)

// Defaults of Options.
const (
	DefaultMaxBy = 1 << 14 // 5.5 MiB of histograms
	// DefaultWatchFunctions and DefaultWatchCookies are NewForWatch's
	// room: functions over every file, and the watch's cookies.
	DefaultWatchFunctions = 1 << 14
	DefaultWatchCookies   = 1 << 20
)

// Options change what a Timer times. A nil *Options is the zero value.
type Options struct {
	// By is what calls are timed by besides their function:
	// count.ByProcess or count.ByCgroup (count.BySite, the zero value,
	// by function only).
	By count.By
	// MaxBy bounds the pairs of function and process or cgroup timed
	// with By (default DefaultMaxBy); a call past it is timed by its
	// function only (Snapshot.Unattributed).
	MaxBy int
	// Functions and Cookies are NewForWatch's room (defaults
	// DefaultWatchFunctions and DefaultWatchCookies): a function past it
	// is not timed, a site whose cookie is past it neither.
	Functions, Cookies int
	// PerFile, with NewForWatch, times a function's copies in several
	// files apart: one Function each. Without it a function of one
	// probe and name is one Function over every file.
	PerFile bool
}

// Plan is what Resolve resolved: the sites of the functions to time.
type Plan struct {
	*multiprobe.Plan
	// Session says the sites are uprobe sessions (Linux 6.13+), one per
	// function; else each function has an entry and a return site.
	Session bool
}

// Resolve resolves the functions that probes' entry probes select for
// timing: as uprobe sessions where the kernel has them and the functions
// are not Go's, else as entry and return probes. Close the Plan when done.
func Resolve(probes []multiprobe.Probe, opts *multiprobe.Options) (*Plan, error) {
	o := multiprobe.Options{}
	if opts != nil {
		o = *opts
	}
	for _, p := range probes {
		if p.Kind != multiprobe.Entry {
			return nil, fmt.Errorf("latency: probe %s: give the functions' entry probes (uprobe:TARGET:PATTERN); their returns are the timer's: %w", p, multiprobe.ErrBadSpec)
		}
	}
	f := o.Features
	if f == nil {
		d, err := kernelprobe.Detect()
		if err != nil {
			return nil, fmt.Errorf("latency: %w", err)
		}
		f = &d
	}
	if f.Path() == kernelprobe.PathUprobeMulti && f.UprobeSession {
		s := o
		s.Session = true
		plan, err := multiprobe.Resolve(probes, &s)
		if !errors.Is(err, multiprobe.ErrGoReturn) {
			if err != nil {
				return nil, err
			}
			return &Plan{Plan: plan, Session: true}, nil
		}
	}
	plan, err := multiprobe.Resolve(Pairs(probes), &o)
	if err != nil {
		return nil, err
	}
	return &Plan{Plan: plan}, nil
}

// Pairs returns each of probes and its return probe: what a package
// watch attaches for NewForWatch.
func Pairs(probes []multiprobe.Probe) []multiprobe.Probe {
	pairs := slices.Clone(probes)
	for _, p := range probes {
		p.Kind = multiprobe.Return
		pairs = append(pairs, p)
	}
	return pairs
}

// A Timer is the timing program, loaded, and its histograms.
type Timer struct {
	spec    *ebpf.CollectionSpec
	coll    *ebpf.Collection // the program, and the maps not in objs
	objs    readMaps
	prog    *ebpf.Program
	session bool
	by      count.By
	perFile bool
	maxFns  int
	cookies int
	link    *multiprobe.Link // Attach's

	mu  sync.Mutex
	fns []multiprobe.Site // by number: each function's entry site
	fn  map[fnKey]uint32  // NewForWatch's functions
}

// readMaps are the maps of latency.c that Go reads or fills.
type readMaps struct {
	ByHists   *ebpf.Map `ebpf:"by_hists"`
	Hists     *ebpf.Map `ebpf:"hists"`
	Sites     *ebpf.Map `ebpf:"sites"`
	Unmatched *ebpf.Map `ebpf:"unmatched"`
}

// fnKey is a function over every file (Fill): its probe (target and
// patterns, whichever kind), name, and with PerFile its file.
type fnKey struct{ target, patterns, name, path string }

// New loads the timing program for plan, prepared for it (plan.Prepare),
// and fills in each site's function. Attach it with
// plan.Attach(t.Program()), or use Attach, which does both.
func New(plan *Plan, opts *Options) (_ *Timer, err error) {
	if plan == nil || plan.Plan == nil {
		return nil, errors.New("latency: nil plan")
	}
	sites := plan.Sites()
	t, spec, err := newTimer(plan.Session, opts)
	if err != nil {
		return nil, err
	}
	entries, err := t.functions(sites)
	if err != nil {
		return nil, err
	}
	cookies := 1
	for _, s := range sites {
		cookies = max(cookies, int(min(s.Cookie, 1<<30))+1)
	}
	t.cookies = cookies
	spec.Maps["sites"].MaxEntries = uint32(cookies)
	spec.Maps["hists"].MaxEntries = uint32(max(len(t.fns), 1))
	if err := plan.Prepare(spec); err != nil {
		return nil, fmt.Errorf("latency: %w", err)
	}
	if err := t.load(); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			t.Close()
		}
	}()
	for i, s := range sites {
		if err := t.objs.Sites.Put(uint32(s.Cookie), entries[i]); err != nil {
			return nil, fmt.Errorf("latency: filling in the sites: %w", err)
		}
	}
	return t, nil
}

// Attach loads the timing program for plan (New) and attaches it to
// plan's sites; Close detaches it.
func Attach(plan *Plan, opts *Options) (*Timer, error) {
	t, err := New(plan, opts)
	if err != nil {
		return nil, err
	}
	if t.link, err = plan.Attach(t.Program()); err != nil {
		t.Close()
		return nil, fmt.Errorf("latency: %w", err)
	}
	return t, nil
}

// NewForWatch loads the timing program, by entry and return probes, for a
// package watch whose plans are resolved with planOpts: give watch.New
// Pairs(probes), t.Spec() and t.Program(), and its Options.Resolved (and
// the Report of files it takes back from pins) t.Fill.
func NewForWatch(planOpts *multiprobe.Options, opts *Options) (*Timer, error) {
	t, spec, err := newTimer(false, opts)
	if err != nil {
		return nil, err
	}
	t.fn = map[fnKey]uint32{}
	t.maxFns, t.cookies = DefaultWatchFunctions, DefaultWatchCookies
	if opts != nil && opts.Functions > 0 {
		t.maxFns = opts.Functions
	}
	if opts != nil && opts.Cookies > 0 {
		t.cookies = min(opts.Cookies, 1<<30)
	}
	spec.Maps["sites"].MaxEntries = uint32(t.cookies)
	spec.Maps["hists"].MaxEntries = uint32(t.maxFns)
	if err := multiprobe.PrepareSpec(spec, planOpts); err != nil {
		return nil, fmt.Errorf("latency: %w", err)
	}
	if err := t.load(); err != nil {
		return nil, err
	}
	return t, nil
}

// newTimer is a Timer not loaded yet, and the spec of its one program:
// the session one calls kfuncs that kernels before 6.13 do not have.
func newTimer(session bool, opts *Options) (*Timer, *ebpf.CollectionSpec, error) {
	o := Options{}
	if opts != nil {
		o = *opts
	}
	if o.MaxBy <= 0 {
		o.MaxBy = DefaultMaxBy
	}
	mode := uint32(0)
	switch o.By {
	case count.BySite:
	case count.ByProcess:
		mode = 1 // by.h's BY_PID
	case count.ByCgroup:
		mode = 2 // BY_CGROUP
	default:
		return nil, nil, fmt.Errorf("latency: Options.By %v: want count.BySite, ByProcess or ByCgroup", o.By)
	}
	spec, err := loadTimer()
	if err != nil {
		return nil, nil, err
	}
	name := "latency_pair"
	if session {
		name = "latency_session"
	}
	for n := range spec.Programs {
		if n != name {
			delete(spec.Programs, n)
		}
	}
	if err := spec.Variables["by"].Set(mode); err != nil {
		return nil, nil, fmt.Errorf("latency: %w", err)
	}
	if mode != 0 {
		spec.Maps["by_hists"].MaxEntries = uint32(o.MaxBy)
	}
	return &Timer{spec: spec, session: session, by: o.By, perFile: o.PerFile}, spec, nil
}

// load loads the prepared spec.
func (t *Timer) load() error {
	coll, err := ebpf.NewCollection(t.spec)
	if err != nil {
		if errors.Is(err, unix.EPERM) {
			return fmt.Errorf("latency: loading the timer: %w (run as root, or with CAP_BPF and CAP_PERFMON)", err)
		}
		return fmt.Errorf("latency: loading the timer: %w", err)
	}
	if err := coll.Assign(&t.objs); err != nil {
		coll.Close()
		return fmt.Errorf("latency: %w", err)
	}
	t.coll = coll
	for _, p := range coll.Programs {
		t.prog = p // the one program newTimer left in the spec
	}
	return nil
}

// functions numbers the functions of a plan's sites, each by its entry
// site, and returns what the program needs to know of each site.
func (t *Timer) functions(sites []multiprobe.Site) ([]timerSite, error) {
	entries := make([]timerSite, len(sites))
	// A function's entry and return sites share its symbol's address, not
	// always their offsets: a Go function's entry is probed after its
	// stack check.
	type key struct {
		path string
		addr uint64
	}
	keyOf := func(s multiprobe.Site) key { return key{s.Path, s.Symbol.Address} }
	row := map[key]uint32{}
	var entryOf []int // the entry site of each function
	for i, s := range sites {
		if s.Probe.Kind == multiprobe.Entry {
			row[keyOf(s)] = uint32(len(t.fns))
			entries[i].Fn = uint32(len(t.fns))
			entryOf = append(entryOf, i)
			t.fns = append(t.fns, s)
		}
	}
	for i, s := range sites {
		if s.Probe.Kind != multiprobe.Return {
			continue
		}
		fn, ok := row[keyOf(s)]
		if !ok {
			return nil, fmt.Errorf("latency: return site %s in %s at %#x has no entry site", s.Name, s.Path, s.Offset)
		}
		entries[i] = timerSite{Fn: fn, IsReturn: 1, SpGain: returnSPGain(s)}
		if s.Returns != nil {
			// A Go function: time both ends by goroutine.
			entries[i].Go = 1
			entries[entryOf[fn]].Go = 1
		}
	}
	return entries, nil
}

// returnSPGain is how much higher the stack pointer is where the return
// probe of s runs than it was at the function's entry probe. The kernel's
// return probe runs after the return instruction: on x86-64 that popped the
// return address the call pushed, 8 bytes; on arm64 the return address was
// in the link register, so nothing. A Go function's return is probed at
// its return instruction, before the pop, and its entry after the stack
// check, before the frame is made (elfsym.MovedGoStackCheck): the same
// stack pointer on both architectures.
func returnSPGain(s multiprobe.Site) uint16 {
	if s.Returns != nil || runtime.GOARCH != "amd64" {
		return 0
	}
	return 8
}

// Fill fills in the sites of a file a package watch is about to attach
// (its Options.Resolved) or took back from a pin (a Restored Report), for
// a Timer from NewForWatch: the returns before the entries, so that no
// start is noted for a function whose return does not know it yet. Until
// then a site reads as zeros, an entry of function 0, which notes a start
// no return takes (the LRU ages it out): a call made as its file is
// attached may go untimed, none is timed wrong. Functions past the room
// (Options.Functions) are not timed. It may be called from several
// goroutines.
func (t *Timer) Fill(r watch.Report) {
	if t.fn == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	entries := make([]timerSite, len(r.Sites))
	timed := make([]bool, len(r.Sites))
	goFn := map[uint32]bool{}
	for i, s := range r.Sites {
		k := fnKey{s.Probe.Target, strings.Join(s.Probe.Patterns, ","), s.Name, ""}
		if t.perFile {
			k.path = s.Path
		}
		fn, ok := t.fn[k]
		if !ok {
			if len(t.fns) == t.maxFns {
				continue
			}
			fn = uint32(len(t.fns))
			t.fn[k] = fn
			entry := s
			entry.Probe = &multiprobe.Probe{Kind: multiprobe.Entry, Target: s.Probe.Target, Patterns: s.Probe.Patterns}
			t.fns = append(t.fns, entry)
		}
		timed[i] = true
		entries[i].Fn = fn
		if s.Probe.Kind == multiprobe.Return {
			entries[i] = timerSite{Fn: fn, IsReturn: 1, SpGain: returnSPGain(s)}
			if s.Returns != nil {
				goFn[fn] = true
			}
		}
	}
	for _, ret := range []bool{true, false} {
		for i, s := range r.Sites {
			if !timed[i] || (s.Probe.Kind == multiprobe.Return) != ret || s.Cookie >= uint64(t.cookies) {
				continue
			}
			if goFn[entries[i].Fn] {
				entries[i].Go = 1
			}
			t.objs.Sites.Put(uint32(s.Cookie), entries[i])
		}
	}
}

// Program is the timing program, to attach to the plan's sites.
func (t *Timer) Program() *ebpf.Program { return t.prog }

// Spec is the spec the program was loaded from, prepared: what a package
// watch's New takes with Program.
func (t *Timer) Spec() *ebpf.CollectionSpec { return t.spec }

// Session says the program is the session one (Plan.Session).
func (t *Timer) Session() bool { return t.session }

// Link is the link Attach made, nil for a Timer from New or NewForWatch.
func (t *Timer) Link() *multiprobe.Link { return t.link }

// Close detaches what Attach attached and closes the program and its
// maps. It may be called more than once.
func (t *Timer) Close() error {
	var errs []error
	if t.link != nil {
		errs = append(errs, t.link.Close())
		t.link = nil
	}
	if t.coll != nil {
		t.coll.Close() // the program, and the maps Go does not read
		t.coll = nil
		for _, m := range []*ebpf.Map{t.objs.ByHists, t.objs.Hists, t.objs.Sites, t.objs.Unmatched} {
			if m != nil {
				errs = append(errs, m.Close())
			}
		}
	}
	return errors.Join(errs...)
}

// Histogram is the times of a function's calls.
type Histogram struct {
	// Slots[i] counts the calls that took from 2^i to 2^(i+1) ns.
	Slots [Slots]uint64
	// Count is how many calls were timed, SumNs their time in all.
	Count, SumNs uint64
}

// Function is one function's histogram: Site is its entry site (with a
// Probe of Kind Entry, also where the plan has sessions).
type Function struct {
	Site multiprobe.Site
	Histogram
}

// ByFunction is one function's histogram of the calls by one process or
// cgroup (Options.By): Function is an index in Snapshot.Functions, Who the
// pid or cgroup id.
type ByFunction struct {
	Function int
	Who      uint64
	Histogram
}

// Snapshot is what a Timer timed, as it read the histograms.
type Snapshot struct {
	// Functions are every function timed, by number, with or without
	// calls.
	Functions []Function
	// Unmatched is how many returns had no entry to pair with: calls in
	// flight at attach, or whose start was evicted (pairs only).
	Unmatched uint64
	// By are the histograms by process or cgroup (Options.By), those
	// with calls; Unattributed is how many timed calls they have no
	// room for (Options.MaxBy).
	By           []ByFunction
	Unattributed uint64
}

// Snapshot reads the histograms. It may be called while the program runs.
func (t *Timer) Snapshot() (*Snapshot, error) {
	t.mu.Lock()
	fns := slices.Clone(t.fns)
	t.mu.Unlock()
	s := &Snapshot{Functions: make([]Function, len(fns))}
	if err := t.objs.Unmatched.Lookup(uint32(0), &s.Unmatched); err != nil {
		return nil, fmt.Errorf("latency: reading the unmatched returns: %w", err)
	}
	var all uint64
	for i, site := range fns {
		var h timerHist
		if err := t.objs.Hists.Lookup(uint32(i), &h); err != nil {
			return nil, fmt.Errorf("latency: reading the histogram of %s: %w", site.Name, err)
		}
		s.Functions[i] = Function{Site: site, Histogram: Histogram{Slots: h.Slots, Count: h.Count, SumNs: h.SumNs}}
		all += h.Count
	}
	if t.by == count.BySite {
		return s, nil
	}
	var (
		k        timerByKey
		h        timerHist
		credited uint64
	)
	it := t.objs.ByHists.Iterate()
	for it.Next(&k, &h) {
		if int(k.Key) >= len(fns) || h.Count == 0 {
			continue
		}
		credited += h.Count
		s.By = append(s.By, ByFunction{Function: int(k.Key), Who: k.Who, Histogram: Histogram{Slots: h.Slots, Count: h.Count, SumNs: h.SumNs}})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("latency: reading the histograms by %v: %w", t.by, err)
	}
	if all > credited {
		s.Unattributed = all - credited
	}
	return s, nil
}
