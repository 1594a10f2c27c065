package multiprobe

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/multiprobe/multiprobe/kernelprobe"
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
// again on a prepared spec. It writes cs: plans that prepare one spec from
// several goroutines take turns (package watch holds a lock around it).
func (pl *Plan) Prepare(cs *ebpf.CollectionSpec) error {
	return pl.prepare(cs)
}

// PrepareSpec prepares cs as Plan.Prepare does where no plan exists yet,
// for plans resolved later with opts (package watch resolves one per file
// as files appear): the attach type of the kernel's path and, before
// Linux 5.15, the section the per-site copies read their cookie from.
// Each plan's own Prepare still runs before its Attach (it may be called
// on a loaded program's spec), to keep the spec for the copies it makes.
func PrepareSpec(cs *ebpf.CollectionSpec, opts *Options) error {
	if cs == nil {
		return fmt.Errorf("multiprobe: PrepareSpec: nil CollectionSpec")
	}
	pl := &Plan{}
	if opts != nil {
		pl.opts = *opts
	}
	if err := pl.setup(); err != nil {
		return err
	}
	kernelprobe.PrepareCollectionSpec(cs, pl.features.Path())
	_, _, _, err := pl.fixCookies(cs)
	return err
}

func (pl *Plan) prepare(cs *ebpf.CollectionSpec) error {
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
		} else if pl.inBPFPIDs() == nil && !pl.opts.Updatable {
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
// was prepared for: a session program (SEC("uprobe.session")) too, which
// a pid filter goes into as into any other.
func isUprobeSpec(p *ebpf.ProgramSpec) bool {
	at := kernelprobe.AttachType(p, kernelprobe.PathUprobeMulti)
	return at == ebpf.AttachTraceUprobeMulti || at == kernelprobe.AttachTraceUprobeSession
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
	// The kernel's filter takes one pid, fixed at attach; descendants
	// join the in-BPF set as they are made.
	if len(pl.opts.PIDs) == 0 && !pl.opts.Descendants && pl.features.Path() == kernelprobe.PathUprobeMulti && pl.features.UprobeMultiPIDFilter {
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
