package load

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/multiprobe/multiprobe/internal/bpfsys"
	"golang.org/x/sys/unix"
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

	// Costs, if set, records every loaded program's measured cost after
	// the phase and saves the cache, whatever the order; with [OrderCached]
	// it also supplies the costs the programs start by. Setting it does not
	// change the order: recording costs nothing, ordering by them is a
	// choice (measured times are noisy on a loaded machine, and the
	// instruction count, the default, needs no state, is never stale and is
	// the same on every machine).
	Costs *CostCache

	// AttachType, if set, returns the expected attach type to load each
	// program with; return spec.AttachType to keep it. It is the hook through
	// which the caller's uprobe path decision (uprobe_multi or perf event, as
	// the kernelprobe package decides it: kernelprobe.AttachType) reaches
	// the loader.
	AttachType func(name string, spec *ebpf.ProgramSpec) ebpf.AttachType

	// SplitTailCallMaps gives each kind of program sharing a tail-call map
	// (PROG_ARRAY) its own copy of the map, instead of failing with a
	// [*TailCallMixError]: the kernel requires the programs of one PROG_ARRAY
	// to share their program type and, since Linux 6.12, their expected
	// attach type. The group of the first program (in job order) keeps the
	// map's name, the others get the name followed by their kind (jmp_perfevent),
	// each copy holds the entries of the map's contents that name its group's
	// programs, and the group's references to the map are rewritten to the
	// copy. [Profile.MapCopies] says which copy each program got. Maps given
	// by the caller (to [Programs], or in MapReplacements) are never split.
	SplitTailCallMaps bool

	// VerifierLogs names programs whose whole verifier log is fetched, by
	// loading them once more, if the verifier rejects them. The first
	// rejected program in job order always gets its whole log; the others
	// are reported with the verifier's message only, so that a failing
	// start costs about what a successful one does.
	VerifierLogs []string

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
// Before anything is created, the programs sharing each tail-call map are
// checked to agree on what the kernel requires of them (see
// [TailCallMixError] and [Options.SplitTailCallMaps]).
//
// On success the returned Collection holds every map (the copies of split
// tail-call maps included), variable and program, and the caller must Close
// it. On failure every object the loader created is closed, the Collection
// is nil and the error is an [*Error] listing every failed program (or the
// reason no program could start); the Profile is returned whenever programs
// were loaded, also on failure.
func Collection(spec *ebpf.CollectionSpec, opts *Options) (*ebpf.Collection, *Profile, error) {
	if spec == nil {
		return nil, nil, errors.New("load: nil CollectionSpec")
	}
	l, err := newLoader(opts)
	if err != nil {
		return nil, nil, err
	}
	l.types, l.byteOrder = spec.Types, spec.ByteOrder
	p, err := planCollection(spec, &l.o, l.attachTypes)
	if err != nil {
		return nil, nil, err
	}
	l.adopt(p)
	if err := l.prepare(p.jobs); err != nil {
		return nil, nil, err
	}

	// Create the maps, with every PROG_ARRAY left empty: programs are put in
	// only once all of them loaded, so that a failure never leaves a
	// half-filled tail-call map behind.
	mapSpec := &ebpf.CollectionSpec{
		Maps:      make(map[string]*ebpf.MapSpec, len(p.maps)),
		Variables: spec.Variables,
		Types:     spec.Types,
		ByteOrder: spec.ByteOrder,
	}
	for name, ms := range p.maps {
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
		return nil, nil, fmt.Errorf("create maps: %w", withoutMemlockHint(err))
	}
	l.prof.Maps = time.Since(t0)

	progs, err := l.run(p, coll.Maps)
	if err != nil {
		coll.Close()
		return nil, l.finish(), err
	}
	if err := fillProgArrays(p.maps, coll.Maps, progs); err != nil {
		closeAll(progs)
		coll.Close()
		return nil, l.finish(), err
	}
	coll.Programs = progs
	return coll, l.finish(), nil
}

// planCollection plans the load of spec's programs of known type.
func planCollection(spec *ebpf.CollectionSpec, o *Options, attachTypes bool) (*plan, error) {
	in := planInput{maps: spec.Maps, attachTypeMatters: attachTypes}
	if in.maps == nil {
		in.maps = map[string]*ebpf.MapSpec{}
	}
	for name := range o.MapReplacements {
		if ms := spec.Maps[name]; ms != nil && ms.Type == ebpf.ProgramArray {
			if in.fixed == nil {
				in.fixed = map[string]bool{}
			}
			in.fixed[name] = true
		}
	}
	var skipped []string
	for _, n := range slices.Sorted(maps.Keys(spec.Programs)) {
		ps := spec.Programs[n]
		if ps == nil || ps.Type == ebpf.UnspecifiedProgram {
			skipped = append(skipped, n)
			continue
		}
		in.names = append(in.names, n)
		in.specs = append(in.specs, ps)
	}
	p, err := makePlan(in, o)
	if err != nil {
		return nil, err
	}
	p.skipped = skipped
	return p, nil
}

// Programs loads programs concurrently. Their instructions may reference the
// maps by name; the maps stay the caller's and are never closed or written.
// Each program is named by its spec's Name, which must be unique. Jobs are in
// slice order.
//
// Programs that share one of the caller's tail-call maps must agree on what
// the kernel requires of them ([TailCallMixError]); the caller's maps are
// never split.
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
	fixed := map[string]bool{}
	for name, m := range maps {
		if m != nil && m.Type() == ebpf.ProgramArray {
			fixed[name] = true
		}
	}
	p, err := planPrograms(progs, fixed, &l.o, l.attachTypes)
	if err != nil {
		return nil, nil, err
	}
	l.adopt(p)
	if err := l.prepare(p.jobs); err != nil {
		return nil, nil, err
	}
	loaded, err := l.run(p, maps)
	if err != nil {
		return nil, l.finish(), err
	}
	return loaded, l.finish(), nil
}

// planPrograms plans the load of progs; progArrays names the caller's
// tail-call maps.
func planPrograms(progs []*ebpf.ProgramSpec, progArrays map[string]bool, o *Options, attachTypes bool) (*plan, error) {
	in := planInput{names: make([]string, len(progs)), specs: progs, fixed: progArrays, attachTypeMatters: attachTypes}
	seen := make(map[string]bool, len(progs))
	for i, ps := range progs {
		if ps == nil {
			return nil, fmt.Errorf("load: program %d: nil ProgramSpec", i)
		}
		if ps.Name == "" || seen[ps.Name] {
			return nil, fmt.Errorf("load: program %d: name %q is empty or not unique (programs are reported by name)", i, ps.Name)
		}
		seen[ps.Name] = true
		in.names[i] = ps.Name
	}
	return makePlan(in, o)
}

// LoadAndAssign loads spec like [Collection] and assigns its objects to the
// struct pointed to by to, as ebpf.CollectionSpec.LoadAndAssign does: to is
// written only after every program loaded. Objects not assigned are closed;
// since the kernel empties a tail-call map (PROG_ARRAY) when its last file
// descriptor closes, assign the tail-call maps that programs use (and the
// copies [Options.SplitTailCallMaps] made, by their names in
// [Profile.MapCopies]).
func LoadAndAssign(spec *ebpf.CollectionSpec, to any, opts *Options) (*Profile, error) {
	coll, prof, err := Collection(spec, opts)
	if err != nil {
		return prof, err
	}
	defer coll.Close()
	if err := coll.Assign(to); err != nil {
		return prof, fmt.Errorf("load: assigning the collection: %w", err)
	}
	return prof, nil
}

type loader struct {
	o           Options
	jobs        int
	attachTypes bool // the kernel wants one attach type per PROG_ARRAY
	cache       *btf.Cache
	types       *btf.Spec
	byteOrder   binary.ByteOrder
	start       time.Time
	prof        *Profile
	jobList     []*job // in job order
}

type job struct {
	index  int
	name   string
	orig   *ebpf.ProgramSpec // the caller's, read-only
	spec   *ebpf.ProgramSpec // this job's copy: attach type set, maps associated
	attach ebpf.AttachType
	rename map[string]string // map references rewritten to a tail-call map's copy
	cost   float64
	cached bool

	// Written by the job's goroutine only, read after the phase.
	prog     *ebpf.Program
	err      error
	failure  failure
	perr     *ProgramError // the report of err, made after the phase
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
		o:           o,
		jobs:        jobs,
		attachTypes: tailCallAttachTypes(),
		cache:       cache,
		start:       time.Now(),
		prof: &Profile{
			Jobs:  jobs,
			CPUs:  min(jobs, runtime.GOMAXPROCS(0), runtime.NumCPU()),
			Order: o.Order,
		},
	}, nil
}

// adopt takes the plan's jobs and its report of split maps.
func (l *loader) adopt(p *plan) {
	l.jobList = p.jobs
	l.prof.Programs = make([]ProgramProfile, len(p.jobs))
	l.prof.Skipped = p.skipped
	l.prof.MapCopies = p.copies
}

// prepare does what the loads share, once, before any of them starts: the
// memlock limit and kernel BTF.
func (l *loader) prepare(jobs []*job) error {
	// Without the privilege to raise the memlock rlimit (EPERM) the loads
	// fail with EPERM too, and their errors name the capability that is
	// missing: the rlimit is not what the user lacks.
	if err := bpfsys.RaiseMemlock(); err != nil && !errors.Is(err, unix.EPERM) {
		return fmt.Errorf("load: %w", err)
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
	return nil
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

// run loads the plan's jobs with at most l.jobs at once and returns the
// programs, or closes them all and returns an *Error.
func (l *loader) run(p *plan, maps map[string]*ebpf.Map) (map[string]*ebpf.Program, error) {
	jobs := p.jobs
	// Every job gets its own copy with its maps associated, here, before
	// any load starts: during the phase nothing shared is written.
	for _, j := range jobs {
		j.spec, j.err = associate(j.orig, j.attach, j.rename, maps)
	}

	// The free workers, by number (the profile says which ran a job):
	// taking one before a job starts is what bounds the jobs to l.jobs,
	// and starts them in the plan's order.
	workers := make(chan int, l.jobs)
	for w := range l.jobs {
		workers <- w
	}
	var wg sync.WaitGroup
	phase := time.Now()
	for rank, j := range p.order {
		l.prof.Programs[j.index].Rank = rank
		if j.err != nil {
			continue
		}
		w := <-workers
		wg.Go(func() {
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
		})
	}
	wg.Wait()

	progs := make(map[string]*ebpf.Program, len(jobs))
	var failed []*ProgramError
	for _, j := range jobs {
		if j.err == nil {
			progs[j.name] = j.prog
		}
	}
	if len(progs) == len(jobs) {
		return progs, nil
	}

	// Whole verifier logs are costly (ten times the verification, for a
	// big program), so only the first rejection in job order, and those the
	// caller asked for, get one; the phase is over, so these loads are
	// after it, one at a time, in job order.
	first := true
	for _, j := range jobs {
		if j.failure != failRejected {
			continue
		}
		if first || slices.Contains(l.o.VerifierLogs, j.name) {
			l.fullLog(j)
		}
		first = false
	}
	var rejected []string
	for _, j := range jobs {
		if j.err == nil {
			continue
		}
		pe := newProgramError(j.name, j.err)
		pe.Rejected = j.failure == failRejected
		var fl *fullLogError
		pe.fullLog = errors.As(j.err, &fl)
		if pe.Rejected && !pe.fullLog {
			rejected = append(rejected, j.name)
		}
		if j.failure == failAfterVerification {
			pe.AfterVerification = true
			pe.Causes = diagnose(j, maps)
		}
		j.perr = pe
		failed = append(failed, pe)
	}
	closeAll(progs)
	return nil, &Error{Failures: failed, Programs: len(jobs), withoutLog: rejected}
}

// associate returns a copy of orig to load with attach, its map references
// (renamed by rename first) bound to maps.
func associate(orig *ebpf.ProgramSpec, attach ebpf.AttachType, rename map[string]string, maps map[string]*ebpf.Map) (*ebpf.ProgramSpec, error) {
	spec := orig.Copy()
	spec.AttachType = attach
	for i := range spec.Instructions {
		ins := &spec.Instructions[i]
		ref := ins.Reference()
		// A positive constant is an fd the caller put in by hand.
		if !ins.IsLoadFromMap() || ref == "" || int32(ins.Constant) > 0 {
			continue
		}
		if r, ok := rename[ref]; ok {
			ref = r
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

// failure is how a job's load failed.
type failure int

const (
	failOther             failure = iota // before the verifier ran, or unknown
	failRejected                         // the verifier rejected the program
	failAfterVerification                // verified, then refused by the kernel
)

// load verifies one job, asking for the verifier's statistics only, which
// cost nothing measurable (the same wall time as no log at all, on 6.18)
// and tell a verifier rejection (a message before the statistics) from a
// program the kernel refused after it verified (statistics only); it
// retries after EAGAIN, when a signal interrupted the verifier. No load in
// the phase asks for the whole log, which costs up to ten times the
// verification.
func (l *loader) load(j *job) {
	popts := ebpf.ProgramOptions{LogLevel: ebpf.LogLevelStats, KernelTypes: l.o.KernelTypes}
	for eagain := 0; ; eagain++ {
		t0 := time.Now()
		prog, err := l.attempt(j, j.attempts, popts)
		d := time.Since(t0)
		j.attempts++
		if err == nil {
			j.prog, j.err, j.verify = prog, nil, d
			return
		}
		j.err = err
		if errors.Is(err, syscall.EAGAIN) && eagain < maxEAGAIN {
			continue
		}
		j.failure = classify(err)
		return
	}
}

// fullLog loads a rejected job once more with the verifier's whole log and
// keeps that error, if the verifier rejects it again.
func (l *loader) fullLog(j *job) {
	popts := ebpf.ProgramOptions{
		LogLevel:     ebpf.LogLevelBranch | ebpf.LogLevelStats,
		LogSizeStart: l.o.LogSizeStart,
		KernelTypes:  l.o.KernelTypes,
	}
	t0 := time.Now()
	prog, err := l.attempt(j, j.attempts, popts)
	j.attempts++
	j.ended += time.Since(t0)
	if err == nil {
		// The kernel accepted it this time (a transient failure): the phase
		// has failed anyway, and the first error stands.
		prog.Close()
		return
	}
	if classify(err) == failRejected {
		j.err = &fullLogError{err}
	}
}

// fullLogError marks an error whose verifier log is the whole log.
type fullLogError struct{ error }

func (e *fullLogError) Unwrap() error { return e.error }

// classify tells from a failed load's statistics-level log whether the
// verifier rejected the program or the kernel refused it after verifying.
func classify(err error) failure {
	var ve *ebpf.VerifierError
	if !errors.As(err, &ve) || len(ve.Log) == 0 {
		return failOther
	}
	verified := false
	for _, line := range ve.Log {
		switch {
		case isStatsLine(line):
			if strings.HasPrefix(line, "processed ") {
				verified = true
			}
		case strings.TrimSpace(line) == "":
		default:
			return failRejected
		}
	}
	if verified {
		return failAfterVerification
	}
	return failOther
}

// isStatsLine reports whether line is one of those the verifier writes at
// log level BPF_LOG_STATS after it finished, successfully or not.
func isStatsLine(line string) bool {
	for _, p := range []string{"verification time ", "stack depth ", "processed "} {
		if strings.HasPrefix(line, p) {
			return true
		}
	}
	return false
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
			pp.Err = j.perr
			if pp.Err == nil {
				pp.Err = newProgramError(j.name, j.err)
			}
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
