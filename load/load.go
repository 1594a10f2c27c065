package load

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sync/errgroup"
)

// maxEAGAIN bounds the retries of a load interrupted by a signal. cilium/ebpf
// masks SIGPROF around BPF_PROG_LOAD and retries EAGAIN itself; this covers
// other signals and callers that unmask it.
const maxEAGAIN = 10

// defaultNsPerInsn estimates the verification time of a program the cost
// cache does not know, per static instruction, when no cached program gives a
// rate for this kernel (measured on Linux 6.18 x86-64: 250-280 ns per
// processed instruction).
const defaultNsPerInsn = 250

// Options control a load phase. The zero value loads GOMAXPROCS programs at
// once, longest (by instruction count) first.
type Options struct {
	// Jobs is the maximum number of programs verified at once; 0 means
	// GOMAXPROCS. More than the CPUs only adds contention: the verifier is
	// CPU-bound.
	Jobs int

	// Order is the order in which programs start; the default is OrderLPT.
	Order Order

	// Costs, if set, orders the programs with [OrderCached] and, after the
	// phase, records every loaded program's measured cost in the cache and
	// saves it. The instruction count stays the default because it needs no
	// state: it is known before the first start, never stale, the same on
	// every machine, and right whenever a program's cost follows its size
	// (straight-line code); measured times are noisy on a loaded machine and
	// need a writable file.
	Costs *CostCache

	// AttachType, if set, returns the expected attach type to load each
	// program with; return spec.AttachType to keep it. It is the hook through
	// which the uprobe path decision (uprobe_multi or perf event, made by the
	// kernelprobe package) reaches the loader; see [UprobeAttachType].
	// Programs sharing a tail-call map must get one attach type, else the
	// load fails with [ErrAttachTypeMix] before anything is created.
	AttachType func(name string, spec *ebpf.ProgramSpec) ebpf.AttachType

	// BTF is the kernel BTF cache shared by every load. nil creates one for
	// the phase, so that kernel BTF is parsed at most once per call.
	BTF *btf.Cache

	// KernelTypes, if set, replaces the kernel's BTF for CO-RE relocations
	// (for example BTF from BTFHub on a kernel without its own). It is
	// passed as ebpf.ProgramOptions.KernelTypes to every load. Left nil,
	// relocations use BTF's shared cache, which also covers kernel modules.
	KernelTypes *btf.Spec

	// Maps controls the creation of a Collection's maps.
	Maps ebpf.MapOptions

	// MapReplacements are used instead of creating a Collection's maps of
	// the same name; see ebpf.CollectionOptions.
	MapReplacements map[string]*ebpf.Map

	// LogSizeStart is the first verifier log buffer size for reporting a
	// failure; the buffer grows to fit the log.
	LogSizeStart uint32

	// hook wraps every load attempt; tests count concurrent loads and
	// inject failures through it.
	hook func(name string, attempt int, popts ebpf.ProgramOptions, load func() (*ebpf.Program, error)) (*ebpf.Program, error)
}

// Collection creates the maps of spec and loads its programs concurrently.
//
// Maps are created first, sequentially, with their contents, except that
// tail-call maps (PROG_ARRAY) are filled only after every program loaded.
// Programs of unspecified type are skipped. Jobs are in program name order.
//
// On success the returned Collection holds every map, variable and program,
// and the caller must Close it. On failure every object the loader created is
// closed, the Collection is nil and the error is an [*Error] listing every
// failed program (or the reason no program could start); the Profile is
// returned whenever programs were loaded, also on failure.
func Collection(spec *ebpf.CollectionSpec, opts *Options) (*ebpf.Collection, *Profile, error) {
	if spec == nil {
		return nil, nil, errors.New("load: nil CollectionSpec")
	}
	l, err := newLoader(opts)
	if err != nil {
		return nil, nil, err
	}
	l.types, l.byteOrder = spec.Types, spec.ByteOrder

	progArrays := map[string][]string{}
	for name, ms := range spec.Maps {
		if ms.Type != ebpf.ProgramArray {
			continue
		}
		progArrays[name] = nil
		for _, kv := range ms.Contents {
			if s, ok := kv.Value.(string); ok {
				progArrays[name] = append(progArrays[name], s)
			}
		}
	}

	var names []string
	var specs []*ebpf.ProgramSpec
	for _, n := range slices.Sorted(maps.Keys(spec.Programs)) {
		ps := spec.Programs[n]
		if ps == nil || ps.Type == ebpf.UnspecifiedProgram {
			l.prof.Skipped = append(l.prof.Skipped, n)
			continue
		}
		names = append(names, n)
		specs = append(specs, ps)
	}
	jobs := l.jobsFor(names, specs)
	if err := checkTailCallGroups(jobs, progArrays); err != nil {
		return nil, nil, err
	}
	if err := l.prepare(jobs); err != nil {
		return nil, nil, err
	}

	// Create the maps, with every PROG_ARRAY left empty: programs are put in
	// only once all of them loaded, so that a failure never leaves a
	// half-filled tail-call map behind.
	mapSpec := &ebpf.CollectionSpec{
		Maps:      make(map[string]*ebpf.MapSpec, len(spec.Maps)),
		Variables: spec.Variables,
		Types:     spec.Types,
		ByteOrder: spec.ByteOrder,
	}
	for name, ms := range spec.Maps {
		if ms.Type == ebpf.ProgramArray && len(ms.Contents) > 0 {
			ms = ms.Copy()
			ms.Contents = nil
		}
		mapSpec.Maps[name] = ms
	}
	t0 := time.Now()
	coll, err := ebpf.NewCollectionWithOptions(mapSpec, ebpf.CollectionOptions{
		Maps:            l.o.Maps,
		MapReplacements: l.o.MapReplacements,
		Cache:           l.cache,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("create maps: %w", err)
	}
	l.prof.Maps = time.Since(t0)

	progs, err := l.run(jobs, coll.Maps)
	if err != nil {
		coll.Close()
		return nil, l.finish(), err
	}
	if err := fillProgArrays(spec.Maps, coll.Maps, progs); err != nil {
		closeAll(progs)
		coll.Close()
		return nil, l.finish(), err
	}
	coll.Programs = progs
	return coll, l.finish(), nil
}

// Programs loads programs concurrently. Their instructions may reference the
// maps by name; the maps stay the caller's and are never closed or written.
// Each program is named by its spec's Name, which must be unique. Jobs are in
// slice order.
//
// On success the caller must Close every returned program. On failure every
// program the loader created is closed and the error is an [*Error] listing
// every failed program; the Profile is returned whenever programs were
// loaded.
func Programs(progs []*ebpf.ProgramSpec, maps map[string]*ebpf.Map, opts *Options) (map[string]*ebpf.Program, *Profile, error) {
	l, err := newLoader(opts)
	if err != nil {
		return nil, nil, err
	}
	names := make([]string, len(progs))
	seen := make(map[string]bool, len(progs))
	for i, ps := range progs {
		if ps == nil {
			return nil, nil, fmt.Errorf("load: program %d: nil ProgramSpec", i)
		}
		if ps.Name == "" || seen[ps.Name] {
			return nil, nil, fmt.Errorf("load: program %d: name %q is empty or not unique (programs are reported by name)", i, ps.Name)
		}
		seen[ps.Name] = true
		names[i] = ps.Name
	}
	progArrays := map[string][]string{}
	for name, m := range maps {
		if m != nil && m.Type() == ebpf.ProgramArray {
			progArrays[name] = nil
		}
	}
	jobs := l.jobsFor(names, progs)
	if err := checkTailCallGroups(jobs, progArrays); err != nil {
		return nil, nil, err
	}
	if err := l.prepare(jobs); err != nil {
		return nil, nil, err
	}
	loaded, err := l.run(jobs, maps)
	if err != nil {
		return nil, l.finish(), err
	}
	return loaded, l.finish(), nil
}

// LoadAndAssign loads spec like [Collection] and assigns its objects to the
// struct pointed to by to, as ebpf.CollectionSpec.LoadAndAssign does: to is
// written only after every program loaded. Objects not assigned are closed;
// since the kernel empties a tail-call map (PROG_ARRAY) when its last file
// descriptor closes, assign the tail-call maps that programs use.
func LoadAndAssign(spec *ebpf.CollectionSpec, to any, opts *Options) (*Profile, error) {
	coll, prof, err := Collection(spec, opts)
	if err != nil {
		return prof, err
	}
	defer coll.Close()
	if err := coll.Assign(to); err != nil {
		return prof, fmt.Errorf("assign: %w", err)
	}
	return prof, nil
}

type loader struct {
	o         Options
	jobs      int
	cache     *btf.Cache
	types     *btf.Spec
	byteOrder binary.ByteOrder
	start     time.Time
	prof      *Profile
	jobList   []*job // in job order
}

type job struct {
	index  int
	name   string
	orig   *ebpf.ProgramSpec // the caller's, read-only
	spec   *ebpf.ProgramSpec // this job's copy: attach type set, maps associated
	attach ebpf.AttachType
	cost   float64
	cached bool

	// Written by the job's goroutine only, read after the phase.
	prog     *ebpf.Program
	err      error
	worker   int
	started  time.Duration
	ended    time.Duration
	verify   time.Duration
	verified uint32
	attempts int
}

func newLoader(opts *Options) (*loader, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Jobs < 0 {
		return nil, fmt.Errorf("load: %d jobs: want 0 (GOMAXPROCS) or more", o.Jobs)
	}
	if o.Order < OrderLPT || o.Order > OrderCached {
		return nil, fmt.Errorf("load: %v", o.Order)
	}
	if o.Order == OrderCached && o.Costs == nil {
		return nil, fmt.Errorf("load: %w", ErrNoCostCache)
	}
	jobs := o.Jobs
	if jobs == 0 {
		jobs = runtime.GOMAXPROCS(0)
	}
	cache := o.BTF
	if cache == nil {
		cache = btf.NewCache()
	}
	return &loader{
		o:     o,
		jobs:  jobs,
		cache: cache,
		start: time.Now(),
		prof: &Profile{
			Jobs:  jobs,
			CPUs:  min(jobs, runtime.GOMAXPROCS(0), runtime.NumCPU()),
			Order: o.Order,
		},
	}, nil
}

// jobsFor makes one job per program, in job order, and resolves its
// expected attach type.
func (l *loader) jobsFor(names []string, specs []*ebpf.ProgramSpec) []*job {
	jobs := make([]*job, len(specs))
	for i, ps := range specs {
		at := ps.AttachType
		if l.o.AttachType != nil {
			at = l.o.AttachType(names[i], ps)
		}
		jobs[i] = &job{index: i, name: names[i], orig: ps, attach: at}
	}
	l.jobList = jobs
	l.prof.Programs = make([]ProgramProfile, len(jobs))
	return jobs
}

var (
	memlockOnce sync.Once
	memlockErr  error
)

// prepare does what the loads share, once, before any of them starts: the
// memlock limit, kernel BTF, the order.
func (l *loader) prepare(jobs []*job) error {
	// The memlock rlimit is process-wide: raising it per program would be
	// wasted syscalls. RemoveMemlock does nothing on kernels since 5.11,
	// which account BPF memory to the memory cgroup instead.
	memlockOnce.Do(func() { memlockErr = rlimit.RemoveMemlock() })
	if memlockErr != nil {
		return fmt.Errorf("load: raise the memlock rlimit (needed before Linux 5.11): %w", memlockErr)
	}

	// Parse kernel BTF here, once, if any program needs it, rather than in
	// whichever load asks first: the others would wait on the cache's lock
	// and the first load's measured cost would include the parse.
	if l.o.KernelTypes == nil && slices.ContainsFunc(jobs, func(j *job) bool { return needsKernelBTF(j.orig) }) {
		t0 := time.Now()
		// An error (no kernel BTF) is left to the loads that need it, which
		// report it with their program's name.
		_, _ = l.cache.Kernel()
		l.prof.BTF = time.Since(t0)
	}

	switch l.o.Order {
	case OrderLPT:
		for _, j := range jobs {
			j.cost = float64(len(j.orig.Instructions))
		}
	case OrderCached:
		l.cachedCosts(jobs)
	}
	return nil
}

// cachedCosts estimates each job's verification time in nanoseconds: the
// measured time for programs the cache knows, the instruction count times
// the kernel's rate per processed instruction for the others.
func (l *loader) cachedCosts(jobs []*job) {
	var ns, insns float64
	costs := make([]Cost, len(jobs))
	for i, j := range jobs {
		c, ok := l.o.Costs.lookup(j.orig, j.attach)
		if !ok {
			continue
		}
		costs[i], j.cached = c, true
		if c.Verified > 0 {
			ns += float64(c.Verify)
			insns += float64(c.Verified)
		}
	}
	rate := float64(defaultNsPerInsn)
	if insns > 0 {
		rate = ns / insns
	}
	for i, j := range jobs {
		if j.cached {
			j.cost = float64(costs[i].Verify)
		} else {
			j.cost = float64(len(j.orig.Instructions)) * rate
		}
	}
}

// needsKernelBTF reports whether loading spec reads kernel BTF: CO-RE
// relocations, kfunc calls, or an attach target found by name in BTF.
func needsKernelBTF(spec *ebpf.ProgramSpec) bool {
	if spec.AttachTo != "" && spec.AttachTarget == nil {
		switch spec.Type {
		case ebpf.Tracing, ebpf.LSM, ebpf.StructOps:
			return true
		}
	}
	for i := range spec.Instructions {
		ins := &spec.Instructions[i]
		if ins.IsKfuncCall() || btf.CORERelocationMetadata(ins) != nil {
			return true
		}
	}
	return false
}

// run loads the jobs with at most l.jobs at once and returns the programs,
// or closes them all and returns an *Error.
func (l *loader) run(jobs []*job, maps map[string]*ebpf.Map) (map[string]*ebpf.Program, error) {
	// Every job gets its own copy with its maps associated, here, before
	// any load starts: during the phase nothing shared is written.
	for _, j := range jobs {
		j.spec, j.err = associate(j.orig, j.attach, maps)
	}

	order := slices.Clone(jobs)
	if l.o.Order != OrderGiven {
		// Stable: equal costs keep job order, so runs are reproducible.
		slices.SortStableFunc(order, func(a, b *job) int { return cmp.Compare(b.cost, a.cost) })
	}

	workers := make(chan int, l.jobs)
	for w := range l.jobs {
		workers <- w
	}
	var g errgroup.Group
	g.SetLimit(l.jobs)
	phase := time.Now()
	for rank, j := range order {
		l.prof.Programs[j.index].Rank = rank
		if j.err != nil {
			continue
		}
		g.Go(func() error {
			w := <-workers
			defer func() { workers <- w }()
			j.worker = w
			j.started = time.Since(phase)
			l.load(j)
			j.ended = time.Since(phase)
			if j.prog != nil {
				// Read now: on a failure elsewhere the program is closed
				// before the profile is complete.
				if info, err := j.prog.Info(); err == nil {
					j.verified, _ = info.VerifiedInstructions()
				}
			}
			// A job's failure is its own: the others run to completion so
			// that every failure is reported, not only the first.
			return nil
		})
	}
	_ = g.Wait()

	progs := make(map[string]*ebpf.Program, len(jobs))
	var failed []*ProgramError
	for _, j := range jobs {
		if j.err != nil {
			failed = append(failed, newProgramError(j.name, j.err))
			continue
		}
		progs[j.name] = j.prog
	}
	if len(failed) > 0 {
		closeAll(progs)
		return nil, &Error{Failures: failed, Programs: len(jobs)}
	}
	return progs, nil
}

// associate returns a copy of orig to load with attach, its map references
// bound to maps.
func associate(orig *ebpf.ProgramSpec, attach ebpf.AttachType, maps map[string]*ebpf.Map) (*ebpf.ProgramSpec, error) {
	spec := orig.Copy()
	spec.AttachType = attach
	for i := range spec.Instructions {
		ins := &spec.Instructions[i]
		ref := ins.Reference()
		// A positive constant is an fd the caller put in by hand.
		if !ins.IsLoadFromMap() || ref == "" || int32(ins.Constant) > 0 {
			continue
		}
		m := maps[ref]
		if m == nil {
			return nil, fmt.Errorf("instruction %d references map %s, which is not given: add it to the spec or the maps", i, ref)
		}
		if err := ins.AssociateMap(m); err != nil {
			return nil, fmt.Errorf("instruction %d: map %s: %w", i, ref, err)
		}
	}
	return spec, nil
}

// load verifies one job: first without a verifier log, which is large and
// costly; again with a log only to report a failure; again after EAGAIN,
// when a signal interrupted the verifier.
func (l *loader) load(j *job) {
	popts := ebpf.ProgramOptions{LogDisabled: true, KernelTypes: l.o.KernelTypes}
	eagain := 0
	for attempt := 0; ; attempt++ {
		t0 := time.Now()
		prog, err := l.attempt(j, attempt, popts)
		d := time.Since(t0)
		j.attempts++
		if err == nil {
			j.prog, j.err, j.verify = prog, nil, d
			return
		}
		j.err = err
		switch {
		case errors.Is(err, syscall.EAGAIN) && eagain < maxEAGAIN:
			eagain++
		case popts.LogDisabled:
			popts.LogDisabled = false
			popts.LogLevel = ebpf.LogLevelBranch
			popts.LogSizeStart = l.o.LogSizeStart
		default:
			return
		}
	}
}

func (l *loader) attempt(j *job, attempt int, popts ebpf.ProgramOptions) (*ebpf.Program, error) {
	once := func() (*ebpf.Program, error) { return l.loadOnce(j, popts) }
	if l.o.hook != nil {
		return l.o.hook(j.name, attempt, popts, once)
	}
	return once()
}

// loadOnce loads j through a one-program collection: unlike
// ebpf.NewProgramWithOptions, which builds a BTF cache per call, it takes the
// phase's shared cache, so kfuncs and attach targets are looked up in kernel
// BTF parsed once.
func (l *loader) loadOnce(j *job, popts ebpf.ProgramOptions) (*ebpf.Program, error) {
	cs := &ebpf.CollectionSpec{
		Programs:  map[string]*ebpf.ProgramSpec{j.name: j.spec},
		Types:     l.types,
		ByteOrder: l.byteOrder,
	}
	coll, err := ebpf.NewCollectionWithOptions(cs, ebpf.CollectionOptions{Programs: popts, Cache: l.cache})
	if err != nil {
		return nil, err
	}
	prog := coll.DetachProgram(j.name)
	coll.Close()
	return prog, nil
}

// finish completes the profile and records measured costs.
func (l *loader) finish() *Profile {
	p := l.prof
	var first, last time.Duration = -1, 0
	for _, j := range l.jobList {
		pp := &p.Programs[j.index]
		pp.Name = j.name
		pp.Type = j.orig.Type.String()
		pp.AttachType = attachName(j.attach)
		pp.Instructions = len(j.orig.Instructions)
		pp.Cached = j.cached
		pp.Worker = j.worker
		pp.Start, pp.End = j.started, j.ended
		pp.Verify = j.verify
		pp.Attempts = j.attempts
		if j.err != nil {
			pp.Err = newProgramError(j.name, j.err)
			pp.Error = pp.Err.Error()
		}
		pp.Verified = j.verified
		if j.attempts == 0 {
			continue // never started
		}
		if first < 0 || pp.Start < first {
			first = pp.Start
		}
		last = max(last, pp.End)
		p.Work += pp.Wall()
		p.Longest = max(p.Longest, pp.Wall())
	}
	if first >= 0 {
		p.Makespan = last - first
	}
	p.LowerBound = max(p.Longest, p.Work/time.Duration(max(p.CPUs, 1)))
	p.Total = time.Since(l.start)

	if c := l.o.Costs; c != nil {
		for i, j := range l.jobList {
			if j.err == nil && j.prog != nil {
				pp := &p.Programs[i]
				c.record(j.orig, j.attach, Cost{Verify: pp.Verify, Verified: pp.Verified, Instructions: pp.Instructions})
			}
		}
		if err := c.Save(); err != nil {
			p.CostCacheError = err.Error()
		}
	}
	return p
}

// fillProgArrays puts the loaded programs into the tail-call maps their
// specs' contents name.
func fillProgArrays(specs map[string]*ebpf.MapSpec, created map[string]*ebpf.Map, progs map[string]*ebpf.Program) error {
	for _, name := range slices.Sorted(maps.Keys(specs)) {
		ms := specs[name]
		if ms.Type != ebpf.ProgramArray {
			continue
		}
		m := created[name]
		for _, kv := range ms.Contents {
			v := kv.Value
			if s, ok := v.(string); ok {
				p := progs[s]
				if p == nil {
					return fmt.Errorf("tail-call map %s names program %s, which was not loaded (is its type known?)", name, s)
				}
				v = p
			}
			if err := m.Put(kv.Key, v); err != nil {
				return fmt.Errorf("tail-call map %s: put %v: %w", name, kv.Key, err)
			}
		}
	}
	return nil
}

func closeAll(progs map[string]*ebpf.Program) {
	for _, p := range progs {
		p.Close()
	}
}
