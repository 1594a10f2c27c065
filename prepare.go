package multiprobe

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"

	"github.com/multiprobe/multiprobe/internal/fds"
	"github.com/multiprobe/multiprobe/internal/target"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/load"
	"github.com/multiprobe/multiprobe/pidfilter"
	"github.com/multiprobe/multiprobe/usdt"
)

var (
	// ErrNoPIDFilter is returned by Link.SetPIDs for a link without an
	// in-BPF pid filter (its plan had no Options.PIDs), and by Plan.Attach,
	// with ErrNotPrepared, when the plan filters by pid inside BPF and the
	// program's spec did not go through its Prepare.
	ErrNoPIDFilter = errors.New("no in-BPF pid filter")
	// ErrNotPrepared is returned by Plan.Attach when the link needs a copy
	// of the program (its own pid filter, or per-site cookies on a kernel
	// without BPF cookies) and the program's spec did not go through this
	// plan's Prepare, which keeps what the copy is made from.
	ErrNotPrepared = errors.New("its spec did not go through the plan's Prepare")
	// ErrTooManyClones is returned by Plan.Prepare on a kernel without BPF
	// cookies (before Linux 5.15) for a plan with more than MaxClones
	// sites and a program that reads its cookie with mp_cookie: each site
	// would need a clone of the program, loaded and verified on its own.
	ErrTooManyClones = errors.New("too many sites to clone the program for each")
)

// MaxClones bounds the per-site clones of one program that a plan may need
// on a kernel without BPF cookies (see the package documentation): every
// clone is verified again, and past this many sites the attach would load,
// and the per-site perf events detach, for minutes.
const MaxClones = 4096

// Names of what bpf/mp_cookie.bpf.h declares.
const (
	cookieSection  = ".rodata.mp_cookie"
	cookieFixedVar = "mp_cookie_fixed"
	cookieValueVar = "mp_cookie_value"
)

// Prepare readies cs, before it is loaded, for the plan's attach path and
// Options:
//
//   - uprobe programs get the expected attach type of the path
//     (kernelprobe.PrepareCollectionSpec): uprobe_multi on Linux 6.6+,
//     none for per-site perf-event uprobes;
//   - where the plan filters by pid and the kernel cannot (the perf-event
//     path, uprobe_multi before the 6.10 fix, or a set of pids), the plan
//     keeps a copy of every uprobe program, from which Attach loads each
//     Link's own filtered copy (see Link);
//   - on kernels without BPF cookies (before 5.15), programs that include
//     bpf/mp_cookie.bpf.h are set to take their cookie from a constant,
//     and the plan keeps a copy of them so that Attach can clone them per
//     site.
//
// The program as the user loads it stays as written: a Link that filters
// nothing attaches it unchanged, at no cost per run. Then load cs as
// usual: ebpf.NewCollection, a bpf2go LoadAndAssign, or package load.
// Change no program's instructions after Prepare (maps and constants may
// change: the copies use the loaded program's maps). Prepare may be called
// again on a prepared spec.
func (pl *Plan) Prepare(cs *ebpf.CollectionSpec) error {
	if cs == nil {
		return fmt.Errorf("multiprobe: Prepare: nil CollectionSpec")
	}
	kernelprobe.PrepareCollectionSpec(cs, pl.features.Path())
	var progs []string
	for name, p := range cs.Programs {
		if isUprobeSpec(p) {
			progs = append(progs, name)
		}
	}
	slices.Sort(progs)
	sec, fixed, value, err := pl.fixCookies(cs)
	if err != nil {
		return err
	}
	pl.mu.Lock()
	defer pl.mu.Unlock()
	for _, name := range progs {
		p := cs.Programs[name]
		ps := &preparedSpec{}
		if sec != nil && references(p, cookieSection) {
			if len(pl.rows) > MaxClones {
				return fmt.Errorf("multiprobe: program %s reads its cookie with mp_cookie, and kernel %s has no BPF cookies (Linux 5.15+), "+
					"so each of the plan's %d sites would need a clone of it, more than MaxClones (%d): %w; probe fewer sites, or use a kernel with BPF cookies",
					name, pl.features.Release, len(pl.rows), MaxClones, ErrTooManyClones)
			}
			ps.section, ps.fixed, ps.value = sec.Copy(), fixed, value
		} else if pl.inBPFPIDs() == nil {
			continue // attached as it is loaded
		}
		ps.prog = p.Copy()
		pl.prepared = slices.DeleteFunc(pl.prepared, func(old *preparedSpec) bool { return old.prog.Name == p.Name })
		pl.prepared = append(pl.prepared, ps)
	}
	return nil
}

// fixCookies sets mp_cookie_fixed on a kernel without BPF cookies, so
// that the programs load there (the verifier drops the
// bpf_get_attach_cookie call as dead code), and returns the section and
// the offsets of its two constants; nil where the kernel has cookies or
// cs does not include bpf/mp_cookie.bpf.h.
func (pl *Plan) fixCookies(cs *ebpf.CollectionSpec) (sec *ebpf.MapSpec, fixedOff, valueOff uint32, err error) {
	if pl.features.Cookies {
		return nil, 0, 0, nil
	}
	sec = cs.Maps[cookieSection]
	fixed, value := cs.Variables[cookieFixedVar], cs.Variables[cookieValueVar]
	if sec == nil || fixed == nil || value == nil {
		return nil, 0, 0, nil // the programs do not read cookies
	}
	if value.Size() != 8 || fixed.Size() != 1 || uint64(value.Offset)+8 > uint64(sec.ValueSize) {
		return nil, 0, 0, fmt.Errorf("multiprobe: %s has an unexpected layout: object built with another bpf/mp_cookie.bpf.h", cookieSection)
	}
	if err := fixed.Set(true); err != nil {
		return nil, 0, 0, fmt.Errorf("multiprobe: setting %s: %w", cookieFixedVar, err)
	}
	return sec, fixed.Offset, value.Offset, nil
}

// isUprobeSpec reports whether p is a uprobe program, whichever path it
// was prepared for.
func isUprobeSpec(p *ebpf.ProgramSpec) bool {
	return kernelprobe.AttachType(p, kernelprobe.PathUprobeMulti) == ebpf.AttachTraceUprobeMulti
}

func references(p *ebpf.ProgramSpec, m string) bool {
	for _, ins := range p.Instructions {
		if ins.IsLoadFromMap() && ins.Reference() == m {
			return true
		}
	}
	return false
}

// allPIDs is every pid the options name, sorted, without repeats.
func (pl *Plan) allPIDs() []int {
	pids := slices.Clone(pl.opts.PIDs)
	if pl.opts.PID != 0 {
		pids = append(pids, pl.opts.PID)
	}
	slices.Sort(pids)
	return slices.Compact(pids)
}

// inBPFPIDs returns the pids the in-BPF filter must admit, or nil when no
// in-BPF filter is needed: without a pid, or when the kernel's uprobe_multi
// pid filter covers the one pid asked for. Prepare and Attach decide with
// it, so they agree.
//
// The kernel's own filter is not used on the perf-event path (a perf
// event's pid names one thread, not a process) nor on uprobe_multi before
// Linux 6.10 (see the kernelprobe package's table of version floors).
func (pl *Plan) inBPFPIDs() []int {
	pids := pl.allPIDs()
	if len(pids) == 0 {
		return nil
	}
	if len(pl.opts.PIDs) == 0 && pl.features.Path() == kernelprobe.PathUprobeMulti && pl.features.UprobeMultiPIDFilter {
		return nil
	}
	return pids
}

// needsMaps reports whether Attach cannot do without the program's maps:
// a copy of the program shares them, and USDT specs go into one.
func (pl *Plan) needsMaps() bool {
	return pl.inBPFPIDs() != nil || pl.usdt || !pl.features.Cookies
}

// kernelPID is the pid the kernel's own filter takes, 0 for none: Options.PID
// alone, on uprobe_multi with the 6.10 fix.
func (pl *Plan) kernelPID() int {
	if pl.inBPFPIDs() == nil {
		return pl.opts.PID
	}
	return 0
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
		if k := l.plan.kernelPID(); k != 0 {
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
// program's spec map and returns the kernel cookie of USDT site i. A
// program without the map does not read arguments: its sites keep their
// plain cookies, which mp_usdt_cookie reads as well.
func (l *Link) acquireSpecs(maps progMaps) (func(i int, cookie uint64) uint64, error) {
	plain := func(_ int, c uint64) uint64 { return c }
	if !l.plan.usdt {
		return plain, nil
	}
	m := maps.get(usdt.SpecMapName)
	if m == nil {
		return plain, nil
	}
	// One spec per USDT row, in row order: the order in which targets
	// numbers the USDT sites for usdtCookie.
	var specs []usdt.Spec
	for _, r := range l.plan.rows {
		pp := &l.plan.probes[r.probe]
		if pp.sel != nil {
			continue
		}
		s := &pp.usdt[r.k]
		if s.args.err != nil {
			return nil, fmt.Errorf("probe %s: %s: %w", pp.probe, pp.file.path, s.args.err)
		}
		specs = append(specs, s.args.spec)
	}
	ids, err := usdt.AcquireSpecs(m, specs)
	if err != nil {
		return nil, fmt.Errorf("multiprobe: %w", err)
	}
	l.specIDs = ids
	idList := ids.IDs()
	return func(i int, c uint64) uint64 { return usdt.PackCookie(idList[i], uint32(c)) }, nil
}

// programsFor returns what Attach attaches to the sites of targets: prog
// itself, or copies of it that the link owns and closes, for its pid filter
// and, on a kernel without BPF cookies, one per site (see "Pid filters" and
// "Kernels without BPF cookies" in the package doc). single is the program
// for every site, or nil when perSite holds one per site.
func (l *Link) programsFor(prog *ebpf.Program, maps progMaps, targets []target.Target) (single *ebpf.Program, perSite []*ebpf.Program, err error) {
	pl := l.plan
	ps, err := pl.preparedFor(prog)
	if err != nil {
		return nil, nil, err
	}
	if ps == nil {
		switch {
		case l.filter != nil:
			return nil, nil, fmt.Errorf("multiprobe: program %v: %w, which puts in the pid filter for Options.PIDs on this kernel; call plan.Prepare(spec) before loading it (%w)",
				prog, ErrNotPrepared, ErrNoPIDFilter)
		case !pl.features.Cookies && maps.get(cookieSection) != nil:
			return nil, nil, fmt.Errorf("multiprobe: program %v reads its cookie with mp_cookie, and kernel %s has no BPF cookies: %w, which gives each site its cookie; call plan.Prepare(spec) before loading it",
				prog, pl.features.Release, ErrNotPrepared)
		}
		return prog, nil, nil
	}
	cookies := ps.section != nil
	if l.filter == nil && !cookies {
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

// preparedFor finds the spec that Prepare kept for prog: by name, and by
// tag among specs whose names the kernel cuts to the same 15 bytes.
func (pl *Plan) preparedFor(prog *ebpf.Program) (*preparedSpec, error) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if len(pl.prepared) == 0 {
		return nil, nil
	}
	info, err := prog.Info()
	if err != nil {
		return nil, fmt.Errorf("multiprobe: program %v: %w", prog, err)
	}
	var match []*preparedSpec
	for _, ps := range pl.prepared {
		if kernelName(ps.prog.Name) == info.Name {
			match = append(match, ps)
		}
	}
	if len(match) > 1 {
		match = slices.DeleteFunc(match, func(ps *preparedSpec) bool {
			tag, err := ps.prog.Tag()
			return err != nil || tag != info.Tag
		})
	}
	if len(match) != 1 {
		return nil, nil
	}
	return match[0], nil
}

// cookieMap makes the frozen .rodata.mp_cookie of one clone.
func (ps *preparedSpec) cookieMap(cookie uint64) (*ebpf.Map, error) {
	spec := ps.section.Copy()
	b := make([]byte, spec.ValueSize)
	b[ps.fixed] = 1
	binary.NativeEndian.PutUint64(b[ps.value:], cookie)
	spec.Contents = []ebpf.MapKV{{Key: uint32(0), Value: b}}
	m, err := ebpf.NewMap(spec)
	if err != nil {
		return nil, fmt.Errorf("multiprobe: %s for cookie %d: %w", cookieSection, cookie, err)
	}
	return m, nil
}
