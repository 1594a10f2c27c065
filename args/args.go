package args

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/elfsym"
	"github.com/multiprobe/multiprobe/usdt"
	"github.com/multiprobe/multiprobe/watch"
)

const (
	// MaxStrings is how many arguments a hit reads as C strings.
	MaxStrings = 3
	// StringLen bounds each string read, its NUL included.
	StringLen = 128
	// Ret, in Options.Strings and Hit.Strings, is a return probe's value.
	Ret = -1
	// MaxFuncArgs is how many of a function's integer arguments a hit
	// carries at the most.
	MaxFuncArgs = 6
)

// DefaultWatchCookies is how many cookies NewForWatch has room for by
// default.
const DefaultWatchCookies = 1 << 20

var (
	// ErrClosed is returned by Read once the Tracer is closed.
	ErrClosed = os.ErrClosed
	// ErrFlushed is returned by Read once the hits buffered at Flush are
	// read.
	ErrFlushed = ringbuf.ErrFlushed
)

// Options change what a Tracer reads. A nil *Options is the zero value.
type Options struct {
	// Args is how many of a function's first integer arguments a hit at
	// a uprobe carries, from 0 to MaxFuncArgs (and at least those read as
	// strings); a USDT hit carries all of its probe's, a return probe's
	// its value.
	Args int
	// Strings are the arguments read as C strings at each hit, at most
	// MaxStrings: argument numbers (a USDT probe's from 0 to 11, a
	// function's from 0 to 5), and Ret for a return probe's value. A Go
	// program's strings are a pointer and a length: not read.
	Strings []int
	// Cookies is how many cookies NewForWatch has room for (default
	// DefaultWatchCookies).
	Cookies int
}

// Hit is one hit of a site, with what its kind of site carries.
type Hit struct {
	Site multiprobe.Site
	// Args are a USDT probe's arguments, or a uprobe's function's first
	// Options.Args integer arguments.
	Args []int64
	// Ret is a return probe's value, nil at other sites.
	Ret *int64
	// Strings are the Options.Strings read as C strings, by argument
	// number (Ret for the return value): those readable there.
	Strings map[int]string
}

// The layout of args.c's struct hit.
const (
	hitArgsAt    = 8
	hitRegsAt    = hitArgsAt + 8*usdt.MaxArgs
	hitStrLensAt = hitRegsAt + 8*8
	hitStrsAt    = hitStrLensAt + 4*MaxStrings + 4
	hitSize      = hitStrsAt + MaxStrings*StringLen
	regRet       = 6    // regs[6], the return value
	strNone      = 0xff // STR_NONE
)

// cArgRegs and goArgRegs are the indexes into a hit's registers of a
// function's first six integer arguments: in the C calling convention, and
// in Go's (ABIInternal: RAX, RBX, RCX, RDI, RSI, R8 on x86-64, the same
// registers as C's on arm64).
var cArgRegs, goArgRegs = []int{0, 1, 2, 3, 4, 5}, func() []int {
	if runtime.GOARCH == "amd64" {
		return []int{6, 7, 3, 0, 1, 4}
	}
	return []int{0, 1, 2, 3, 4, 5}
}()

// A Tracer is the tracing program, loaded, its counts and its hits.
type Tracer struct {
	spec    *ebpf.CollectionSpec
	coll    *ebpf.Collection
	prog    *ebpf.Program
	counts  *ebpf.Map
	dropped *ebpf.Map
	rd      *ringbuf.Reader
	nargs   int
	strs    []int
	cookies int
	link    *multiprobe.Link // Attach's

	closeOnce sync.Once
	mu        sync.Mutex
	sites     map[uint32]multiprobe.Site
	goFile    map[string]bool // by path: whose arguments are in Go's registers
	rec       ringbuf.Record
}

// New loads the tracing program for plan, prepared for it (plan.Prepare).
// Attach it with plan.Attach(t.Program()), or use Attach, which does both.
func New(plan *multiprobe.Plan, opts *Options) (*Tracer, error) {
	if plan == nil {
		return nil, errors.New("args: nil plan")
	}
	sites := plan.Sites()
	cookies := 1
	for _, s := range sites {
		cookies = max(cookies, int(min(s.Cookie, 1<<30))+1)
	}
	t, err := load(opts, cookies, func(spec *ebpf.CollectionSpec) error { return plan.Prepare(spec) })
	if err != nil {
		return nil, err
	}
	for _, s := range sites {
		t.sites[uint32(s.Cookie)] = s
	}
	return t, nil
}

// Attach loads the tracing program for plan (New) and attaches it to
// plan's sites; Close detaches it.
func Attach(plan *multiprobe.Plan, opts *Options) (*Tracer, error) {
	t, err := New(plan, opts)
	if err != nil {
		return nil, err
	}
	if t.link, err = plan.Attach(t.Program()); err != nil {
		t.Close()
		return nil, fmt.Errorf("args: %w", err)
	}
	return t, nil
}

// NewForWatch loads the tracing program for a package watch whose plans
// are resolved with planOpts: give watch.New t.Spec() and t.Program(), and
// its Options.Resolved t.Fill, which tells the Tracer whose hits are
// whose.
func NewForWatch(planOpts *multiprobe.Options, opts *Options) (*Tracer, error) {
	cookies := DefaultWatchCookies
	if opts != nil && opts.Cookies > 0 {
		cookies = min(opts.Cookies, 1<<30)
	}
	return load(opts, cookies, func(spec *ebpf.CollectionSpec) error { return multiprobe.PrepareSpec(spec, planOpts) })
}

// load loads the tracer, with room for cookies, after prepare has
// prepared its spec.
func load(opts *Options, cookies int, prepare func(*ebpf.CollectionSpec) error) (*Tracer, error) {
	o := Options{}
	if opts != nil {
		o = *opts
	}
	if o.Args < 0 || o.Args > MaxFuncArgs {
		return nil, fmt.Errorf("args: Options.Args %d: want 0 to %d", o.Args, MaxFuncArgs)
	}
	if len(o.Strings) > MaxStrings {
		return nil, fmt.Errorf("args: %d strings: at most %d", len(o.Strings), MaxStrings)
	}
	sel := [MaxStrings]uint32{strNone, strNone, strNone}
	for i, n := range o.Strings {
		switch {
		case n == Ret:
			sel[i] = regRet
		case n < 0 || n >= usdt.MaxArgs:
			return nil, fmt.Errorf("args: string of argument %d: want 0 to %d, or Ret", n, usdt.MaxArgs-1)
		default:
			sel[i] = uint32(n)
		}
	}
	spec, err := loadTracer()
	if err != nil {
		return nil, err
	}
	if err := spec.Variables["str_arg"].Set(sel); err != nil {
		return nil, fmt.Errorf("args: %w", err)
	}
	spec.Maps["counts"].MaxEntries = uint32(cookies)
	if err := prepare(spec); err != nil {
		return nil, fmt.Errorf("args: %w", err)
	}
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		if errors.Is(err, unix.EPERM) {
			return nil, fmt.Errorf("args: loading the tracer: %w (run as root, or with CAP_BPF and CAP_PERFMON)", err)
		}
		return nil, fmt.Errorf("args: loading the tracer: %w", err)
	}
	t := &Tracer{spec: spec, coll: coll, prog: coll.Programs["count_args"], counts: coll.Maps["counts"], dropped: coll.Maps["dropped"],
		nargs: o.Args, strs: slices.Clone(o.Strings), cookies: cookies, sites: map[uint32]multiprobe.Site{}, goFile: map[string]bool{}}
	// A uprobe's hit carries the arguments read as strings, too.
	for _, n := range t.strs {
		if n >= 0 && n < MaxFuncArgs {
			t.nargs = max(t.nargs, n+1)
		}
	}
	if t.rd, err = ringbuf.NewReader(coll.Maps["hits"]); err != nil {
		coll.Close()
		return nil, fmt.Errorf("args: %w", err)
	}
	return t, nil
}

// Fill tells a Tracer from NewForWatch the sites of a file a package watch
// is about to attach (its Options.Resolved) or took back from a pin (a
// Restored Report): their hits are named from here on. It may be called
// from several goroutines.
func (t *Tracer) Fill(r watch.Report) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, s := range r.Sites {
		if s.Cookie < uint64(t.cookies) {
			t.sites[uint32(s.Cookie)] = s
		}
	}
}

// Read returns the next hit, waiting for one: ErrFlushed once the hits
// buffered at Flush are read, ErrClosed once the Tracer is closed. Hits of
// sites the Tracer does not know are passed over. One goroutine at a time
// may call it.
func (t *Tracer) Read() (Hit, error) {
	for {
		if err := t.rd.ReadInto(&t.rec); err != nil {
			if errors.Is(err, ringbuf.ErrFlushed) || errors.Is(err, os.ErrClosed) {
				return Hit{}, err
			}
			return Hit{}, fmt.Errorf("args: reading the hits: %w", err)
		}
		if h, ok := t.decode(t.rec.RawSample); ok {
			return h, nil
		}
	}
}

// Flush makes Read return the hits buffered now, then ErrFlushed: for a
// caller that detached the probes and wants their last hits.
func (t *Tracer) Flush() error { return t.rd.Flush() }

// decode reads one record, false for one too short or of no known site.
func (t *Tracer) decode(b []byte) (Hit, bool) {
	if len(b) < hitSize {
		return Hit{}, false
	}
	t.mu.Lock()
	s, ok := t.sites[binary.NativeEndian.Uint32(b)]
	goFile := ok && t.isGo(s)
	t.mu.Unlock()
	if !ok {
		return Hit{}, false
	}
	val := func(i int) int64 { return int64(binary.NativeEndian.Uint64(b[hitArgsAt+8*i:])) }
	reg := func(i int) int64 { return int64(binary.NativeEndian.Uint64(b[hitRegsAt+8*i:])) }
	h := Hit{Site: s, Args: []int64{}}
	switch s.Probe.Kind {
	case multiprobe.USDT:
		argc := min(int(int32(binary.NativeEndian.Uint32(b[4:]))), usdt.MaxArgs)
		for i := range argc {
			h.Args = append(h.Args, val(i))
		}
	case multiprobe.Return:
		r := reg(regRet)
		h.Ret = &r
	default:
		regs := cArgRegs
		if goFile {
			regs = goArgRegs
		}
		for _, r := range regs[:t.nargs] {
			h.Args = append(h.Args, reg(r))
		}
	}
	// The strings that mean something at this kind of site: a return's
	// value, another's arguments.
	for i, n := range t.strs {
		if (n == Ret) != (h.Ret != nil) || n != Ret && n >= len(h.Args) || goFile {
			continue
		}
		l := int32(binary.NativeEndian.Uint32(b[hitStrLensAt+4*i:]))
		if l <= 0 || l > StringLen {
			continue // not readable there
		}
		if h.Strings == nil {
			h.Strings = map[int]string{}
		}
		h.Strings[n] = string(b[hitStrsAt+StringLen*i:][:l-1])
	}
	return h, true
}

// isGo reports whether s is in a Go program, whose arguments are in Go's
// registers: found out once a file, at its first hit. A C function
// linked into one (cgo) is taken for Go's too. t.mu is held.
func (t *Tracer) isGo(s multiprobe.Site) bool {
	if s.Probe.Kind != multiprobe.Entry {
		return false
	}
	g, ok := t.goFile[s.Path]
	if !ok {
		if f, err := elfsym.Open(s.Path); err == nil {
			g = f.IsGo()
			f.Close()
		}
		t.goFile[s.Path] = g
	}
	return g
}

// Dropped is how many hits found the ring buffer full.
func (t *Tracer) Dropped() (uint64, error) {
	var n uint64
	if err := t.dropped.Lookup(uint32(0), &n); err != nil {
		return 0, fmt.Errorf("args: reading the hits dropped: %w", err)
	}
	return n, nil
}

// Map is the counts of hits, an array from a site's cookie (uint32) to its
// hits (uint64), as package count's.
func (t *Tracer) Map() *ebpf.Map { return t.counts }

// Program is the tracing program, to attach to the sites it traces.
func (t *Tracer) Program() *ebpf.Program { return t.prog }

// Spec is the spec the program was loaded from, prepared: what a package
// watch's New takes with Program.
func (t *Tracer) Spec() *ebpf.CollectionSpec { return t.spec }

// Link is the link Attach made, nil for a Tracer from New or NewForWatch.
func (t *Tracer) Link() *multiprobe.Link { return t.link }

// Close detaches what Attach attached, ends Read (ErrClosed), and closes
// the program and its maps. It may be called more than once.
func (t *Tracer) Close() error {
	var errs []error
	if t.link != nil {
		errs = append(errs, t.link.Close())
		t.link = nil
	}
	// Once: Read may be waiting in the reader meanwhile.
	t.closeOnce.Do(func() {
		errs = append(errs, t.rd.Close())
		t.coll.Close()
	})
	return errors.Join(errs...)
}
