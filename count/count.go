package count

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/multiprobe/multiprobe"
)

// By says what a call is counted by besides its site.
type By int

const (
	// BySite counts each site's calls, and nothing else.
	BySite By = iota
	// ByProcess counts them by process, too: ByCount.Who is the pid (the
	// tgid, what user space calls the process id).
	ByProcess
	// ByCgroup counts them by cgroup, too: ByCount.Who is the cgroup v2
	// id of the calling thread (the inode number of its cgroup's
	// directory), which names a container.
	ByCgroup
)

func (b By) String() string {
	switch b {
	case BySite:
		return "site"
	case ByProcess:
		return "process"
	case ByCgroup:
		return "cgroup"
	}
	return fmt.Sprintf("By(%d)", int(b))
}

// DefaultMaxBy is how many (site, process or cgroup) pairs the program
// counts by default, with By.
const DefaultMaxBy = 1 << 16

// DefaultWatchCookies is how many cookies NewForWatch has room for by
// default: a watch numbers each build's sites from where the last ended.
const DefaultWatchCookies = 1 << 20

// maxCookies bounds the counts' room: an int on every platform, and a BPF
// array's size.
const maxCookies = 1<<31 - 1

// ErrCookie is returned by Read for a site whose cookie is past the counts'
// room.
var ErrCookie = errors.New("site's cookie is past the counter's room")

// Options change what a Counter counts. A nil *Options is the zero value.
type Options struct {
	// By is what calls are counted by besides their site.
	By By
	// MaxBy bounds the pairs of site and process or cgroup that are
	// counted with By (default DefaultMaxBy); a call past it is counted
	// by its site only (Snapshot.Unattributed).
	MaxBy int
	// Cookies is how many cookies the counts have room for, with
	// NewForWatch (default DefaultWatchCookies): a site's cookie must be
	// below it. New makes room for its plan's.
	Cookies int
}

// The values of by.h's by.
const (
	byModeNone   = 0
	byModePID    = 1
	byModeCgroup = 2
)

// A Counter is the counting program, loaded, and its counts.
type Counter struct {
	spec    *ebpf.CollectionSpec
	objs    counterObjects
	by      By
	cookies int
	link    *multiprobe.Link // Attach's
}

// New loads the counting program for plan, prepared for it
// (plan.Prepare), with a count for each of its sites' cookies. Attach it
// with plan.Attach(c.Program()), or use Attach, which does both.
func New(plan *multiprobe.Plan, opts *Options) (*Counter, error) {
	if plan == nil {
		return nil, errors.New("count: nil plan")
	}
	o := options(opts)
	cookies := 1
	for _, s := range plan.Sites() {
		cookies = max(cookies, int(min(s.Cookie, maxCookies-1))+1)
	}
	o.Cookies = cookies
	return load(o, func(spec *ebpf.CollectionSpec) error { return plan.Prepare(spec) })
}

// NewForWatch loads the counting program for a package watch whose plans
// are resolved with planOpts (multiprobe.PrepareSpec): give watch.New
// c.Spec() and c.Program(), and Read the sites its reports name.
func NewForWatch(planOpts *multiprobe.Options, opts *Options) (*Counter, error) {
	o := options(opts)
	if o.Cookies == 0 {
		o.Cookies = DefaultWatchCookies
	}
	return load(o, func(spec *ebpf.CollectionSpec) error { return multiprobe.PrepareSpec(spec, planOpts) })
}

// Attach loads the counting program for plan (New) and attaches it to
// plan's sites; Close detaches it.
func Attach(plan *multiprobe.Plan, opts *Options) (_ *Counter, err error) {
	c, err := New(plan, opts)
	if err != nil {
		return nil, err
	}
	if c.link, err = plan.Attach(c.Program()); err != nil {
		c.Close()
		return nil, fmt.Errorf("count: %w", err)
	}
	return c, nil
}

func options(opts *Options) Options {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.MaxBy <= 0 {
		o.MaxBy = DefaultMaxBy
	}
	return o
}

// load loads the counter as o says, after prepare has prepared its spec.
func load(o Options, prepare func(*ebpf.CollectionSpec) error) (*Counter, error) {
	mode := uint32(byModeNone)
	switch o.By {
	case BySite:
	case ByProcess:
		mode = byModePID
	case ByCgroup:
		mode = byModeCgroup
	default:
		return nil, fmt.Errorf("count: Options.By %v: want BySite, ByProcess or ByCgroup", o.By)
	}
	if o.Cookies < 0 || o.Cookies > maxCookies {
		return nil, fmt.Errorf("count: Options.Cookies %d: from 1 to %d", o.Cookies, maxCookies)
	}
	spec, err := loadCounter()
	if err != nil {
		return nil, fmt.Errorf("count: %w", err)
	}
	if err := spec.Variables["by"].Set(mode); err != nil {
		return nil, fmt.Errorf("count: %w", err)
	}
	spec.Maps["counts"].MaxEntries = uint32(o.Cookies)
	if mode != byModeNone {
		spec.Maps["by_counts"].MaxEntries = uint32(o.MaxBy)
	}
	if err := prepare(spec); err != nil {
		return nil, fmt.Errorf("count: %w", err)
	}
	c := &Counter{spec: spec, by: o.By, cookies: o.Cookies}
	if err := spec.LoadAndAssign(&c.objs, nil); err != nil {
		if errors.Is(err, unix.EPERM) {
			return nil, fmt.Errorf("count: loading the counter: %w (run as root, or with CAP_BPF and CAP_PERFMON)", err)
		}
		return nil, fmt.Errorf("count: loading the counter: %w", err)
	}
	return c, nil
}

// Program is the counting program, to attach to the sites whose calls it
// counts.
func (c *Counter) Program() *ebpf.Program { return c.objs.CountCall }

// Spec is the spec the program was loaded from, prepared: what a
// package watch's New takes with Program.
func (c *Counter) Spec() *ebpf.CollectionSpec { return c.spec }

// Map is the counts, an array from a site's cookie (uint32) to its calls
// (uint64), for a reader of its own (a rate meter, say).
func (c *Counter) Map() *ebpf.Map { return c.objs.Counts }

// Link is the link Attach made, nil for a Counter from New or
// NewForWatch.
func (c *Counter) Link() *multiprobe.Link { return c.link }

// Close detaches what Attach attached and closes the program and its
// maps. It may be called more than once.
func (c *Counter) Close() error {
	var errs []error
	if c.link != nil {
		errs = append(errs, c.link.Close())
		c.link = nil
	}
	errs = append(errs, c.objs.Close())
	return errors.Join(errs...)
}

// Snapshot is what a Counter counted, as it read the counts.
type Snapshot struct {
	// Sites are the sites read, in the order given, with their calls.
	Sites []SiteCount
	// Calls is the sum of the Sites' calls.
	Calls uint64
	// By are the calls by site and by process or cgroup (Options.By),
	// those with calls, most first; Site is an index in Sites.
	By []ByCount
	// Unattributed is how many of Calls By has no room for (MaxBy).
	Unattributed uint64
}

// SiteCount is one site's calls.
type SiteCount struct {
	Site  multiprobe.Site
	Calls uint64
}

// ByCount is one site's calls by one process or cgroup (Options.By).
type ByCount struct {
	Site  int    // in Snapshot.Sites
	Who   uint64 // the pid, or the cgroup id
	Calls uint64
}

// Snapshot reads the counts of the sites Attach attached (the Link's, as
// they are now). It may be called while the program runs.
func (c *Counter) Snapshot() (*Snapshot, error) {
	if c.link == nil {
		return nil, errors.New("count: Snapshot of a Counter that Attach did not attach: Read its sites")
	}
	return c.Read(c.link.Sites())
}

// Read reads the counts of sites: a plan's, or those a package watch
// reported. A site whose cookie is past the counts' room is an error
// wrapping ErrCookie. It may be called while the program runs.
func (c *Counter) Read(sites []multiprobe.Site) (*Snapshot, error) {
	s := &Snapshot{Sites: make([]SiteCount, len(sites))}
	at := make(map[uint32]int, len(sites))
	for i, site := range sites {
		if site.Cookie >= uint64(c.cookies) {
			return nil, fmt.Errorf("count: site %s (cookie %d, room for %d): %w", site.Name, site.Cookie, c.cookies, ErrCookie)
		}
		s.Sites[i].Site = site
		if err := c.objs.Counts.Lookup(uint32(site.Cookie), &s.Sites[i].Calls); err != nil {
			return nil, fmt.Errorf("count: reading the calls of %s: %w", site.Name, err)
		}
		s.Calls += s.Sites[i].Calls
		at[uint32(site.Cookie)] = i
	}
	if c.by == BySite {
		return s, nil
	}
	var (
		k        counterByKey
		n        uint64
		credited uint64
	)
	it := c.objs.ByCounts.Iterate()
	for it.Next(&k, &n) {
		i, ok := at[k.Key]
		if !ok {
			continue // a site not asked for
		}
		credited += n
		s.By = append(s.By, ByCount{Site: i, Who: k.Who, Calls: n})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("count: reading the calls by %v: %w", c.by, err)
	}
	sortBy(s.By)
	if s.Calls > credited {
		s.Unattributed = s.Calls - credited
	}
	return s, nil
}

// sortBy orders counts most calls first, then by site and who.
func sortBy(counts []ByCount) {
	slices.SortFunc(counts, func(a, b ByCount) int {
		return cmp.Or(cmp.Compare(b.Calls, a.Calls), cmp.Compare(a.Site, b.Site), cmp.Compare(a.Who, b.Who))
	})
}
