package multiprobe

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/multiprobe/multiprobe/attach"
	"github.com/multiprobe/multiprobe/fallback"
	"github.com/multiprobe/multiprobe/internal/fds"
	"github.com/multiprobe/multiprobe/internal/target"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/load"
	"github.com/multiprobe/multiprobe/pidfilter"
	"github.com/multiprobe/multiprobe/usdt"
	"golang.org/x/sys/unix"
)

// A Link is a program attached to the sites of a plan. It owns what it
// loaded and wrote for them, and Close undoes exactly that, nothing another
// Link holds: its pid filter, its references to USDT argument specs and its
// per-site copies on kernels without BPF cookies (see the package
// documentation for each).
//
// A Link is safe for concurrent use: Update, Pin, Unpin and Close change
// it one at a time, and each waits for the others; the methods that read
// it (Sites, Programs, FDs, ...) wait for a change in progress and see the
// Link before or after it, never half-changed. SetPIDs and PIDs do not
// wait for an Update: the pid filter stays the Link's across it.
type Link struct {
	plan  *Plan         // nil for a Link taken back by LoadPinnedLink
	prog  *ebpf.Program // as given to Attach
	path  kernelprobe.Path
	units []*unit
	// features are the kernel's, as the plan decided with them.
	features kernelprobe.Features
	// kernelPID is the pid the kernel filters by (Options.PID alone where
	// it can), 0 for none.
	kernelPID int
	// progTag is the kernel's tag of the program given to Attach or
	// UpdateProgram (see Runs).
	progTag string
	clones  []*ebpf.Program // the copies of the program the link loaded
	// cloneGens are the copies' generations (see Update), 0 for a Link
	// without the generation check.
	cloneGens []uint32
	// The generation check (Options.Updatable): the current generation
	// and its three maps.
	gen                            uint32
	genState, genSlots, genRetired *ebpf.Map
	// filtered is the copy with the link's pid filter, for every site,
	// where the kernel has BPF cookies.
	filtered *ebpf.Program
	cloneFDs int           // held by the copies: each program, and its BTF
	specIDs  *usdt.SpecIDs // the USDT sites' argument spec ids
	leftOut  []Site        // sites the kernel refused (see LeftOut)

	// The rest is for pinning (see Pin): where l is pinned, "" if it is
	// not; and for a Link taken back from there, its manifest, and what
	// l holds that Attach did not load or make: the program, when it is
	// not a copy, and the pid filter's maps.
	pinDir string
	pinSeq int // the number of the next unit directory
	// genFloor is the newest generation of an Update cut short, whose
	// pins LoadPinnedLink removed: the next Update numbers past it.
	genFloor uint32
	manifest *manifest
	ownProg  bool
	ownMaps  []*ebpf.Map
	stale    []error

	// state guards the fields above: Update, Pin, Unpin and Close hold
	// it to write, the readers to read. It comes before mu.
	state sync.RWMutex

	mu     sync.Mutex
	forks  *pidfilter.Forks  // with Options.Descendants: the set follows forks
	filter *pidfilter.Filter // the link's own in-BPF pid filter, if it has one
	pids   []int             // what l holds in filter
}

// refusal explains an attach error: where the kernel refused an
// instruction (kernelprobe.ErrUnprobeable) that Resolve's check accepted,
// because a file changed since Resolve read it (ErrFileChanged), or
// because the check did not know the kernel's rule.
func (pl *Plan) refusal(err error) error {
	if !errors.Is(err, kernelprobe.ErrUnprobeable) {
		return err
	}
	for _, of := range pl.files {
		if cerr := of.changed(); cerr != nil {
			return fmt.Errorf("%w: resolve again: %w", cerr, err)
		}
	}
	return fmt.Errorf("%w (multiprobe's check of the kernel's rules let it through: please report the site to multiprobe's issues, and leave it out with '!name')", err)
}

// Attach attaches prog to every site of the plan, all or nothing: on error,
// nothing stays attached. prog must be a kprobe-type program loaded from a
// spec that went through this plan's Prepare (or another plan's with the
// same features). Each site's cookie is its index in Plan.Sites (plus
// Options.CookieBase).
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
	l := &Link{plan: pl, path: pl.features.Path(), features: pl.features, prog: prog, kernelPID: pl.kernelPID()}
	defer func() {
		if err != nil {
			err = errors.Join(err, l.Close())
		}
	}()
	if l.progTag, err = programTag(prog); err != nil {
		return nil, err
	}
	maps, err := programMaps(prog, pl.needsMaps())
	if err != nil {
		return nil, err
	}
	defer maps.close()

	if pl.opts.Updatable {
		l.gen = 1
		if l.genState, l.genSlots, l.genRetired, err = newGenMaps(l.gen); err != nil {
			return nil, err
		}
	}
	if pids := pl.inBPFPIDs(); pids != nil {
		size := max(len(pids), pidfilter.DefaultMaxPIDs)
		if pl.opts.Descendants {
			size = max(len(pids), DescendantPIDs)
		}
		if l.filter, err = pidfilter.NewFilter(uint32(size)); err != nil {
			return nil, fmt.Errorf("multiprobe: %w", err)
		}
		if err := l.filter.Acquire(pids...); err != nil {
			return nil, fmt.Errorf("multiprobe: %w", err)
		}
		l.pids = pids
		// Following forks before any site is attached: a child made
		// from here on is in the set before it runs.
		if pl.opts.Descendants {
			if l.forks, err = l.filter.FollowForks(); err != nil {
				return nil, fmt.Errorf("multiprobe: Options.Descendants: %w", err)
			}
		}
	}
	usdtCookie, specIDs, err := pl.acquireSpecs(maps)
	if err != nil {
		return nil, err
	}
	l.specIDs = specIDs
	// Targets, not Sites: see "Sites and cookies" in the package doc.
	for _, kind := range []Kind{Entry, Return} {
		targets := pl.targets(kind, usdtCookie)
		if len(targets) == 0 {
			continue
		}
		u, err := l.attachUnit(pl, prog, maps, kind, targets, l.gen)
		if err != nil {
			return nil, err
		}
		l.units = append(l.units, u)
	}
	return l, nil
}

// attachUnit attaches the program copy of generation gen (or prog
// itself; see programsFor) to targets, the sites of one kind of pl.
func (l *Link) attachUnit(pl *Plan, prog *ebpf.Program, maps progMaps, kind Kind, targets []target.Target, gen uint32) (*unit, error) {
	single, perSite, err := l.programsFor(pl, prog, maps, targets, gen)
	if err != nil {
		return nil, err
	}
	u := &unit{kind: kind, gen: gen, files: pl.fileIDs(targets)}
	if l.path == kernelprobe.PathUprobeMulti {
		ao := &attach.Options{
			Return:          kind == Return,
			Session:         pl.opts.Session,
			PID:             l.kernelPID,
			Features:        &pl.features,
			LeaveOutRefused: true,
		}
		u.multi, err = attach.UprobeMulti(single, targets, ao)
		var errno unix.Errno
		if err != nil && errors.As(err, &errno) && target.Refusable(errno) {
			// The kernel refused every site, or more than it leaves out:
			// again with the sites named (which this path skips for its
			// speed), so that the error says which functions.
			pl.name(targets)
			u.multi, err = attach.UprobeMulti(single, targets, ao)
		}
		if err != nil {
			return nil, pl.refusal(err)
		}
		if err := l.leaveOut(pl, kind, targets, u.multi.Refused()); err != nil {
			return nil, errors.Join(err, u.close())
		}
		return u, nil
	}
	pl.name(targets)
	fo := &fallback.Options{Return: kind == Return, Features: &pl.features, Programs: perSite, LeaveOutRefused: true}
	if fn := pl.opts.Progress; fn != nil {
		path := ""
		if len(targets) == 1 {
			path = targets[0].Path
		}
		fo.Progress = func(phase string, done, total int) {
			fn(Progress{Phase: phase, Path: path, Done: done, Total: total})
		}
	}
	if u.perSite, err = fallback.Uprobes(single, targets, fo); err != nil {
		return nil, pl.refusal(err)
	}
	if err := l.leaveOut(pl, kind, targets, u.perSite.Refused()); err != nil {
		return nil, errors.Join(err, u.close())
	}
	return u, nil
}

// DescendantPIDs is how many processes a Link with Options.Descendants
// has room for at once in its pid set (a process, or a thread, that
// joins it while it is full is not counted): a build's compilers, a
// shell's pipelines.
const DescendantPIDs = 1 << 15

// leaveOut takes in the sites of kind that the kernel refused as it
// attached targets, for a reason of the site's own (another tracer's
// uprobe there with another ref-counter offset, an instruction it will
// not probe that Resolve's check let through): a site that a glob
// selected is left out, into l.leftOut, and the rest of its file stays
// attached; a site that a probe names exactly is an error, which names
// it and the cause.
func (l *Link) leaveOut(pl *Plan, kind Kind, targets []target.Target, refused []target.Refusal) error {
	if len(refused) == 0 {
		return nil
	}
	sites := pl.siteTable()
	at := map[*os.File]map[uint64]int{} // a file's sites of kind, by offset
	for i, r := range pl.rows {
		pp := &pl.probes[r.probe]
		if pp.attachAs() != kind {
			continue
		}
		m := at[pp.file.f]
		if m == nil {
			m = map[uint64]int{}
			at[pp.file.f] = m
		}
		s := &sites[i]
		m[s.Offset] = i
		for _, off := range s.Returns {
			m[off] = i
		}
	}
	seen := map[int]bool{}
	for _, rf := range refused {
		i, ok := at[targets[rf.Target].File][rf.Offset]
		if !ok {
			return fmt.Errorf("multiprobe: %w (a site of no probe of the plan)", rf.Err)
		}
		if seen[i] {
			continue
		}
		seen[i] = true
		for _, r := range append([]row{pl.rows[i]}, pl.merged[int32(i)]...) {
			if pl.probes[r.probe].probe.namesExactly(sites[i].Name) {
				return fmt.Errorf("multiprobe: %s in %s, which %s names: %w", sites[i].Name, sites[i].Path, pl.probes[r.probe].probe, rf.Err)
			}
		}
		s := sites[i]
		s.LeftOut = rf.Err
		l.leftOut = append(l.leftOut, s)
	}
	return nil
}

// LeftOut returns the sites of the plan that the kernel refused when l
// was attached, for a reason of the site's own, and that l left out, each
// with its LeftOut reason, which names the site and the kernel's errno: a
// site where another tracer holds a uprobe with another ref-counter
// offset (EINVAL), or at an instruction the kernel will not probe though
// Resolve's check let it through (ENOTSUPP, ENOEXEC; kernelprobe.
// ErrUnprobeable). Their cookies count nothing. A site that a probe names
// exactly is never left out: Attach fails instead. Plan.LeftOut lists
// what Resolve left out before.
func (l *Link) LeftOut() []Site {
	l.state.RLock()
	defer l.state.RUnlock()
	return cloneSites(l.leftOut)
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
// at each call; a site's index is its cookie (less Options.CookieBase).
func (l *Link) Sites() []Site {
	l.state.RLock()
	defer l.state.RUnlock()
	return l.sites()
}

func (l *Link) sites() []Site {
	if l.plan == nil {
		return cloneSites(l.manifest.sites)
	}
	return l.plan.Sites()
}

// AttachPath returns the attach path the link took (see Plan.AttachPath).
func (l *Link) AttachPath() kernelprobe.Path { return l.path }

// Links returns the underlying uprobe_multi links, for their kernel info;
// none on the perf-event path.
func (l *Link) Links() []*attach.Link {
	l.state.RLock()
	defer l.state.RUnlock()
	var out []*attach.Link
	for _, u := range l.units {
		if u.multi != nil {
			out = append(out, u.multi)
		}
	}
	return out
}

// Programs returns the programs attached to the sites: the one given to
// Attach, or the link's copies of it (see Link), whose run-time statistics
// (ebpf.Program.Stats) are where the runs are counted. They are the
// link's: do not close them, and read them before Close.
func (l *Link) Programs() []*ebpf.Program {
	l.state.RLock()
	defer l.state.RUnlock()
	return l.programs()
}

func (l *Link) programs() []*ebpf.Program {
	if len(l.clones) > 0 {
		return slices.Clone(l.clones)
	}
	return []*ebpf.Program{l.prog}
}

// Runs reports whether the link's sites run prog's code: the program
// given to Attach or UpdateProgram, or the copies the link made of it,
// which the kernel tells apart from another program by its tag (a hash of
// the instructions, map references aside). So an agent that takes a link
// back from its pins (LoadPinnedLink) can tell whether it runs the
// program the agent loaded now, or an older version's (then
// UpdateProgram). For a Link pinned by a multiprobe that did not record
// the tag in its manifest, Runs is false.
func (l *Link) Runs(prog *ebpf.Program) bool {
	tag, err := programTag(prog)
	if err != nil {
		return false
	}
	l.state.RLock()
	defer l.state.RUnlock()
	return l.progTag != "" && tag == l.progTag
}

// programTag is prog's tag, as the kernel computes it.
func programTag(prog *ebpf.Program) (string, error) {
	if prog == nil {
		return "", fmt.Errorf("multiprobe: nil program: %w", attach.ErrWrongProgram)
	}
	info, err := prog.Info()
	if err != nil {
		return "", fmt.Errorf("multiprobe: reading program %v's tag: %w", prog, err)
	}
	return info.Tag, nil
}

// NumClones returns how many copies of the program the link loaded and holds:
// one per site on a kernel without BPF cookies (before Linux 5.15), for a
// program that reads its cookie with mp_cookie; otherwise one where the
// link filters by pid in BPF, none where it does not.
func (l *Link) NumClones() int {
	l.state.RLock()
	defer l.state.RUnlock()
	return len(l.clones)
}

// NumFDs returns how many file descriptors the link holds: one per binary
// and kind on the uprobe_multi path, one or two per site on the perf-event
// path, one for each copy of the program (see Clones) and one more for its
// BTF if the program has any, two for its own pid filter, and one for its
// handle of the USDT spec table.
func (l *Link) NumFDs() int {
	l.state.RLock()
	defer l.state.RUnlock()
	n := l.cloneFDs
	if l.ownProg {
		n++
	}
	for _, u := range l.units {
		n += u.fds()
	}
	if l.filter != nil {
		n += 2 // its two maps
	}
	if l.specIDs != nil {
		n++ // its handle of the USDT spec table
	}
	if l.genState != nil {
		n += 3 // the generation check's maps
	}
	return n
}

// Close detaches every site, then frees the USDT spec ids and releases
// the pids it holds in the pid filter. It may be called more than once.
//
// A pinned Link (see Pin) stays attached: Close releases only what this
// process holds, its file descriptors, and leaves the probes, their pid
// filter and USDT specs for LoadPinnedLink. Unpin first to detach.
func (l *Link) Close() error {
	l.state.Lock()
	defer l.state.Unlock()
	var errs []error
	if l.genRetired != nil && l.pinDir == "" && len(l.units) > 0 {
		// Silent at once, even while a link outlives its descriptor
		// for a moment (see generation.go): every generation retired
		// and older than the current one, which only older copies read.
		errs = append(errs, retireGens(l.genRetired, l.unitGens()), setGenState(l.genState, l.gen+1, false))
	}
	errs = append(errs, closeUnits(l.units))
	l.units = nil
	for _, p := range l.clones {
		errs = append(errs, p.Close())
	}
	l.clones, l.cloneGens, l.filtered, l.cloneFDs = nil, nil, nil, 0
	if l.specIDs != nil {
		if l.pinDir != "" {
			errs = append(errs, l.specIDs.Close())
		} else {
			errs = append(errs, l.specIDs.Release())
		}
		l.specIDs = nil
	}
	if l.ownProg {
		errs = append(errs, l.prog.Close())
		l.ownProg = false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.forks != nil {
		errs = append(errs, l.forks.Close())
		l.forks = nil
	}
	if l.filter != nil {
		errs = append(errs, l.filter.Close())
		l.filter, l.pids = nil, nil
	}
	for _, m := range l.ownMaps {
		errs = append(errs, m.Close())
	}
	l.ownMaps = nil
	if l.genState != nil {
		errs = append(errs, l.genState.Close(), l.genSlots.Close(), l.genRetired.Close())
		l.genState, l.genSlots, l.genRetired = nil, nil, nil
	}
	return errors.Join(errs...)
}

// progMaps are a loaded program's maps, by their kernel names.
type progMaps map[string]*ebpf.Map

// programMaps opens the maps prog uses. The kernel lists them by ID, and
// opening a map by ID needs CAP_SYS_ADMIN: unless required, Attach goes on
// without them.
func programMaps(prog *ebpf.Program, required bool) (progMaps, error) {
	fail := func(err error) (progMaps, error) {
		if !required {
			return progMaps{}, nil
		}
		return nil, fmt.Errorf("multiprobe: reading the maps of program %v (needs CAP_SYS_ADMIN): %w", prog, err)
	}
	info, err := prog.Info()
	if err != nil {
		return fail(err)
	}
	ids, ok := info.MapIDs()
	if !ok {
		return fail(errors.New("kernel does not list a program's maps"))
	}
	maps := progMaps{}
	for _, id := range ids {
		m, err := ebpf.NewMapFromID(id)
		if err != nil {
			maps.close()
			return fail(err)
		}
		mi, err := m.Info()
		if err != nil {
			m.Close()
			maps.close()
			return fail(err)
		}
		if old := maps[mi.Name]; old != nil {
			// Two maps whose names agree in their first 15 bytes: the
			// kernel's names cannot tell them apart.
			old.Close()
			m.Close()
			maps[mi.Name] = nil
			continue
		}
		maps[mi.Name] = m
	}
	return maps, nil
}

// get returns the map a spec names name, nil if the program has none.
func (pm progMaps) get(name string) *ebpf.Map { return pm[kernelName(name)] }

func (pm progMaps) close() {
	for _, m := range pm {
		if m != nil {
			m.Close()
		}
	}
}

// kernelName is name as cilium/ebpf gives it to the kernel: characters
// other than [A-Za-z0-9._] dropped, cut to BPF_OBJ_NAME_LEN-1 bytes.
func kernelName(name string) string {
	name = strings.Map(func(r rune) rune {
		switch {
		case r >= 'A' && r <= 'Z', r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '.', r == '_':
			return r
		}
		return -1
	}, name)
	if len(name) > 15 {
		name = name[:15]
	}
	return name
}

// SetPIDs replaces the processes whose calls the link's program sees,
// while it stays attached; with no pids, every process, which costs the
// program no pid lookup. It needs the link's own in-BPF filter, which
// Attach gives a link of a plan with Options.PIDs (or Options.PID where
// the kernel cannot filter). Other links, of this program or another, are
// not affected.
func (l *Link) SetPIDs(pids ...int) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.filter == nil {
		if k := l.kernelPID; k != 0 {
			return fmt.Errorf("multiprobe: SetPIDs: the kernel filters this link by pid %d (Options.PID alone on Linux 6.10+); use Options.PIDs for a set that can change", k)
		}
		return fmt.Errorf("multiprobe: SetPIDs: %w: the link's plan has no Options.PIDs (give it some, even one, for a set that can change)", ErrNoPIDFilter)
	}
	for _, pid := range pids {
		if err := checkPID(pid); err != nil {
			return err
		}
		if pid == 0 {
			return fmt.Errorf("multiprobe: SetPIDs: pid 0: call SetPIDs() without pids for every process")
		}
	}
	pids = slices.Clone(pids)
	slices.Sort(pids)
	pids = slices.Compact(pids)
	if len(pids) == 0 {
		pids = []int{pidfilter.AllPIDs}
	}
	if err := l.filter.Replace(l.pids, pids); err != nil {
		return err
	}
	l.pids = pids
	return nil
}

// PIDs returns the processes the link's in-BPF filter admits, sorted; nil
// for every process, or when the link has no in-BPF filter.
func (l *Link) PIDs() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.pids) == 1 && l.pids[0] == pidfilter.AllPIDs {
		return nil
	}
	return slices.Clone(l.pids)
}

// acquireSpecs gives the plan's USDT sites argument spec ids in the
// program's spec map and returns the kernel cookie of USDT site i, with
// the ids taken (nil if none). A program without the map does not read
// arguments: its sites keep their plain cookies, which mp_usdt_cookie
// reads as well.
func (pl *Plan) acquireSpecs(maps progMaps) (func(i int, cookie uint64) uint64, *usdt.SpecIDs, error) {
	plain := func(_ int, c uint64) uint64 { return c }
	if !pl.usdt {
		return plain, nil, nil
	}
	m := maps.get(usdt.SpecMapName)
	if m == nil {
		return plain, nil, nil
	}
	// One spec per USDT row, in row order: the order in which targets
	// numbers the USDT sites for usdtCookie.
	var specs []usdt.Spec
	for _, r := range pl.rows {
		pp := &pl.probes[r.probe]
		if pp.sel != nil {
			continue
		}
		s := &pp.usdt[r.k]
		if s.args.err != nil {
			return nil, nil, fmt.Errorf("probe %s: %s: %w", pp.probe, pp.file.path, s.args.err)
		}
		specs = append(specs, s.args.spec)
	}
	ids, err := usdt.AcquireSpecs(m, specs)
	if err != nil {
		return nil, nil, fmt.Errorf("multiprobe: %w", err)
	}
	idList := ids.IDs()
	return func(i int, c uint64) uint64 { return usdt.PackCookie(idList[i], uint32(c)) }, ids, nil
}

// programsFor returns what Attach attaches to the sites of targets: prog
// itself, or copies of it that the link owns and closes, for its pid filter
// and, on a kernel without BPF cookies, one per site (see "Pid filters" and
// "Kernels without BPF cookies" in the package doc). single is the program
// for every site, or nil when perSite holds one per site.
func (l *Link) programsFor(pl *Plan, prog *ebpf.Program, maps progMaps, targets []target.Target, gen uint32) (single *ebpf.Program, perSite []*ebpf.Program, err error) {
	ps, err := pl.preparedFor(prog)
	if err != nil {
		return nil, nil, err
	}
	if ps == nil {
		switch {
		case l.filter != nil:
			return nil, nil, fmt.Errorf("multiprobe: program %v: %w, which puts in the pid filter for Options.PIDs on this kernel; call plan.Prepare(spec) before loading it (%w)",
				prog, ErrNotPrepared, ErrNoPIDFilter)
		case l.genState != nil:
			return nil, nil, fmt.Errorf("multiprobe: program %v: %w, which puts in the generation check of Options.Updatable; call plan.Prepare(spec) before loading it",
				prog, ErrNotPrepared)
		case !pl.features.Cookies && maps.get(cookieSection) != nil:
			return nil, nil, fmt.Errorf("multiprobe: program %v reads its cookie with mp_cookie, and kernel %s has no BPF cookies: %w, which gives each site its cookie; call plan.Prepare(spec) before loading it",
				prog, pl.features.Release, ErrNotPrepared)
		}
		return prog, nil, nil
	}
	cookies := ps.section != nil
	if l.filter == nil && !cookies && l.genState == nil {
		return prog, nil, nil
	}
	if !cookies && l.filtered != nil {
		return l.filtered, nil, nil // entry and return sites share it
	}
	shared, err := sharedMaps(prog, ps, maps, cookies)
	if err != nil {
		return nil, nil, err
	}
	base := ps.prog.Copy()
	if l.genState != nil {
		if err := injectGen(base, gen); err != nil {
			return nil, nil, err
		}
		shared[genStateName], shared[genSlotsName], shared[genRetiredName] = l.genState, l.genSlots, l.genRetired
	}
	if l.filter != nil {
		if err := pidfilter.InjectProgram(base); err != nil {
			return nil, nil, fmt.Errorf("multiprobe: program %v: %w", prog, err)
		}
		shared[pidfilter.MapName], shared[pidfilter.AllMapName] = l.filter.Map(), l.filter.AllMap()
	}
	specs := []*ebpf.ProgramSpec{base}
	if cookies {
		var consts []*ebpf.Map
		defer func() {
			for _, m := range consts {
				m.Close()
			}
		}()
		if specs, consts, err = l.perSiteSpecs(ps, base, targets); err != nil {
			return nil, nil, err
		}
	}
	loaded, _, err := load.Programs(specs, shared, nil)
	if err != nil {
		what := "a copy of " + prog.String() + " with the link's pid filter"
		if l.filter == nil {
			what = "a copy of " + prog.String() + " with the generation check"
		}
		if cookies {
			what = fmt.Sprintf("a copy of %v per site (kernel %s has no BPF cookies)", prog, pl.features.Release)
		}
		return nil, nil, fmt.Errorf("multiprobe: loading %s: %w", what, err)
	}
	progs := make([]*ebpf.Program, len(specs))
	for i, spec := range specs {
		progs[i] = loaded[spec.Name]
	}
	l.clones = append(l.clones, progs...)
	for range progs {
		l.cloneGens = append(l.cloneGens, gen)
	}
	perCopy := 1
	if btf.FuncMetadata(&base.Instructions[0]) != nil {
		perCopy++ // cilium/ebpf keeps each program's BTF open
	}
	l.cloneFDs += perCopy * len(progs)
	if !cookies {
		l.filtered = progs[0]
		return progs[0], nil, nil
	}
	return nil, progs, nil
}

// sharedMaps are the loaded maps of prog that its copies use as they are:
// every map its spec loads from, but the cookie section a per-site copy
// has its own of.
func sharedMaps(prog *ebpf.Program, ps *preparedSpec, maps progMaps, cookies bool) (map[string]*ebpf.Map, error) {
	shared := map[string]*ebpf.Map{}
	for _, ins := range ps.prog.Instructions {
		ref := ins.Reference()
		if !ins.IsLoadFromMap() || ref == "" || (cookies && ref == cookieSection) || shared[ref] != nil {
			continue
		}
		m := maps.get(ref)
		if m == nil {
			return nil, fmt.Errorf("multiprobe: program %v: cannot find its map %s among the loaded program's maps (names must differ in their first 15 bytes)", prog, ref)
		}
		shared[ref] = m
	}
	return shared, nil
}

// perSiteSpecs returns a copy of base for each site of targets, each bound
// to a cookie section of its own with the site's cookie (see "Kernels
// without BPF cookies" in the package doc), and those sections, which the
// caller closes once the copies are loaded.
func (l *Link) perSiteSpecs(ps *preparedSpec, base *ebpf.ProgramSpec, targets []target.Target) (specs []*ebpf.ProgramSpec, consts []*ebpf.Map, err error) {
	// Per site a clone and its BTF, then a perf event and a link: fail
	// now rather than with EMFILE part way.
	n := target.Targets(targets).Sites()
	if err := fds.Ensure(4*n, fmt.Sprintf("%d per-site clones and uprobes", n)); err != nil {
		return nil, nil, fmt.Errorf("multiprobe: %w", err)
	}
	for i, c := range target.Targets(targets).Cookies() {
		m, err := ps.cookieMap(c)
		if err != nil {
			return nil, consts, err
		}
		consts = append(consts, m)
		spec := base.Copy()
		spec.Name = fmt.Sprintf("%.8s_%d", ps.prog.Name, len(l.clones)+i)
		for j := range spec.Instructions {
			ins := &spec.Instructions[j]
			if ins.IsLoadFromMap() && ins.Reference() == cookieSection {
				if err := ins.AssociateMap(m); err != nil {
					return nil, consts, err
				}
			}
		}
		specs = append(specs, spec)
	}
	return specs, consts, nil
}
