package multiprobe

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/multiprobe/multiprobe/elfsym"
	"github.com/multiprobe/multiprobe/ifunc"
	"github.com/multiprobe/multiprobe/internal/fds"
	"github.com/multiprobe/multiprobe/internal/target"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/usdt"
	"golang.org/x/sys/unix"
)

// ErrFileChanged is returned by Plan.Attach when a binary was modified in
// place after Resolve read it: its offsets may no longer be instructions.
// Resolve again.
var ErrFileChanged = errors.New("binary changed since it was resolved")

// ErrGoReturn is returned for uprobe sessions on a Go program. The kernel's
// return probe, which a session's return part is, replaces the return
// address on the stack with a trampoline of its own, and Go's stack copier
// and unwinder, meeting an address that belongs to no function, crash the
// program ("unexpected return pc"). A uretprobe spec on a Go program
// avoids it: see Site.Returns.
var ErrGoReturn = errors.New("the kernel's return probes crash Go programs")

// A Plan is what Resolve decided: for each probe its file, the sites it
// selected and which of those no earlier probe of the same file and kind
// took, with the kernel's features and the Options. Offsets and cookies
// follow from it, so Attach hands them to the kernel without building the
// Sites: their names are read only when first asked for (for 100,000 sites,
// that is twice the work of finding their offsets). Prepare readies a spec
// for the plan and Attach attaches a program loaded from it, with the same
// Options, so the two cannot disagree.
//
// A Plan holds every resolved binary open, so that Attach probes exactly
// the file that was resolved even if its path is renamed or replaced in
// between: Close releases them. A Plan is safe for concurrent use; Attach
// may be called more than once (each Link has its own pids and ids).
type Plan struct {
	opts     Options
	features kernelprobe.Features
	probes   []planned
	files    []*openFile
	rows     []row // the sites, in cookie order
	usdt     bool  // some probe is a USDT probe
	// merged are, by row, the sites that a row stands for besides its
	// own: of later probes, or of its own probe (IFUNCs that resolve to
	// one implementation), at the same file, kind and offset.
	merged map[int32][]row

	sitesOnce sync.Once
	sites     []Site

	mu       sync.Mutex
	prepared []*preparedSpec // specs that went through Prepare
}

// A row is one site of the plan. The plan's rows are its sites in cookie
// order: a site's cookie is its row's index, its BPF cookie, its index in
// Plan.Sites. Resolve writes them once; the Sites, the kernel's targets,
// the USDT argument specs and the perf-event path's names all read them,
// so that no consumer numbers the sites on its own (see "Sites and
// cookies" in the package doc).
type row struct {
	probe int32 // index in Plan.probes
	k     int32 // the site's index among its probe's (Selection or USDT sites)
}

// planned is one probe as resolved: all the sites it selects, of which
// the rows keep those that no earlier probe of the same file and kind has.
type planned struct {
	probe *Probe
	file  *openFile
	sel   *elfsym.Selection // a uprobe's sites
	usdt  []Site            // a USDT probe's sites, built already
	// offs are where the kernel probes each site: the Selection's offsets,
	// or those of ifuncs, its sites with each IFUNC's resolver given way
	// to its implementation; the USDT sites' offsets.
	offs   []uint64
	ifuncs []elfsym.Site
	// rets are, for a uretprobe spec on a Go program, each site's return
	// instructions, which entry probes stand for the kernel's return
	// probe at (see Site.Returns).
	rets [][]uint64
	// left are the sites, by index, that vet left out, and why.
	left map[int32]error
}

// attachAs is the kind of link the probe's sites attach through.
func (p *planned) attachAs() Kind {
	if p.rets != nil {
		return Entry
	}
	return p.probe.Kind.attachAs()
}

// openFile is one resolved binary, held open from Resolve to Attach.
type openFile struct {
	path string // as resolved, for messages
	real string // symlinks evaluated: two spellings of one file share it
	f    *os.File
	st   unix.Stat_t // at Resolve
	// buildID is the file's GNU build ID, for a pinned Link's manifest.
	buildID []byte
}

// changed reports whether the file was modified in place since Resolve.
func (o *openFile) changed() error {
	var st unix.Stat_t
	if err := unix.Fstat(int(o.f.Fd()), &st); err != nil {
		return fmt.Errorf("%s: %w", o.path, err)
	}
	// Not the ctime: renaming another file over the path (the swap this
	// open file guards against) unlinks this inode, which sets its ctime
	// although not a byte changed. A write sets the mtime.
	if st.Size != o.st.Size || st.Mtim != o.st.Mtim {
		return fmt.Errorf("%s: size or modification time differ from when it was resolved: %w", o.path, ErrFileChanged)
	}
	return nil
}

// Resolve resolves probes to the sites they select, in the order of the
// probes and, within one, of file offset, and decides with the kernel's
// features (or opts.Features) how they will attach. Sites of one file and
// kind at one offset, which two probes or two IFUNCs reach, are one site,
// where the first reached it, with every name in Site.Names: attached
// twice, its program would run twice per call. The cookie of each site is
// its index in Plan.Sites (plus Options.CookieBase). opts may be nil.
func Resolve(probes []Probe, opts *Options) (_ *Plan, err error) {
	if len(probes) == 0 {
		return nil, fmt.Errorf("%w: no probes", ErrBadSpec)
	}
	for i := range probes {
		if err := probes[i].check(""); err != nil {
			return nil, err
		}
	}
	pl := &Plan{}
	if opts != nil {
		pl.opts = *opts
		pl.opts.PIDs = slices.Clone(opts.PIDs)
		pl.opts.DebugDirs = slices.Clone(opts.DebugDirs)
	}
	if err := pl.setup(); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			pl.Close()
		}
	}()
	r := resolver{pl: pl, syms: map[string]*elfsym.File{}, seen: map[fileKind]map[uint64]int32{}, earlier: map[fileKind]bool{}}
	defer r.close()
	// Sites point at their probe: at a copy, not at the caller's slice.
	probes = slices.Clone(probes)
	for i := range probes {
		pps, err := r.resolveTargets(&probes[i])
		if err != nil {
			return nil, fmt.Errorf("probe %s: %w", &probes[i], err)
		}
		for _, pp := range pps {
			r.number(pp)
		}
	}
	if err := pl.checkSession(); err != nil {
		return nil, err
	}
	if err := pl.checkCookieBase(); err != nil {
		return nil, err
	}
	return pl, nil
}

// checkCookieBase refuses an Options.CookieBase whose sites' cookies would
// not fit: in 64 bits, or, where a USDT site's kernel cookie carries its
// argument spec id in the upper half, in 32.
func (pl *Plan) checkCookieBase() error {
	n, base := uint64(len(pl.rows)), pl.opts.CookieBase
	switch {
	case base > math.MaxUint64-n:
		return fmt.Errorf("%w: Options.CookieBase %d: %d sites' cookies would pass 2^64", ErrBadSpec, base, n)
	case pl.usdt && base+n > 1<<32:
		return fmt.Errorf("%w: Options.CookieBase %d: %d sites' cookies would pass 2^32, which a USDT site's must stay below", ErrBadSpec, base, n)
	}
	return nil
}

// resolver is Resolve's state from one probe to the next.
type resolver struct {
	pl   *Plan
	syms map[string]*elfsym.File // by real path: each file's symbols read once
	// seen holds the offsets numbered already and their rows, for a file
	// and kind that a second probe selects from or whose sites moved to
	// their IFUNCs' implementations; most calls have one probe per file,
	// and hashing 100,000 offsets would cost more than resolving them.
	seen    map[fileKind]map[uint64]int32
	earlier map[fileKind]bool // a probe of that file and kind came before
}

// fileKind is what a site is the same site for: by kind, not by the link
// the sites attach through, so that a USDT probe and a uprobe at one
// offset are two sites, two cookies (see semaphores).
type fileKind struct {
	real string
	kind Kind
}

func (r *resolver) close() {
	for _, f := range r.syms {
		f.Close()
	}
}

// resolve finds every site that p selects in target, p's target or one
// of the files it names: where the kernel probes each, and what a
// uretprobe on a Go program probes instead.
func (r *resolver) resolve(p *Probe, target string) (planned, error) {
	pl := r.pl
	of, err := pl.open(target)
	if err != nil {
		return planned{}, err
	}
	pp := planned{probe: p, file: of}
	if p.Kind == USDT {
		pl.usdt = true
		if pp.usdt, err = resolveUSDT(of, p); err != nil {
			return planned{}, err
		}
		pp.offs = make([]uint64, len(pp.usdt))
		for k, s := range pp.usdt {
			pp.offs[k] = s.Offset
		}
		return pp, nil
	}
	f := r.syms[of.real]
	if f == nil {
		if f, err = elfsym.OpenFileOptions(of.f, &elfsym.Options{DebugDirs: pl.opts.DebugDirs}); err != nil {
			return planned{}, err
		}
		r.syms[of.real] = f
		of.buildID = f.BuildID()
	}
	if pl.opts.Session && f.IsGo() && !pl.opts.GoKernelReturns {
		return planned{}, fmt.Errorf("%s is a Go program: uprobe sessions: %w; attach entry and return probes instead", of.path, ErrGoReturn)
	}
	if pp.sel, err = f.Select(p.Patterns...); err != nil {
		return planned{}, err
	}
	if pp.sel.HasIFunc() && !pl.opts.IFuncResolvers {
		pp.ifuncs = ifunc.Sites(of.f, pp.sel.Sites())
		pp.offs = make([]uint64, len(pp.ifuncs))
		for k, s := range pp.ifuncs {
			pp.offs[k] = s.Offset
		}
	} else {
		pp.offs = pp.sel.Offsets()
	}
	if p.Kind == Return && f.IsGo() && !pl.opts.GoKernelReturns {
		if pp.rets, err = pp.sel.GoReturns(); err != nil {
			return planned{}, fmt.Errorf("%w; exclude those functions ('!name'): their returns cannot be probed", err)
		}
	}
	if err := vet(&pp, f); err != nil {
		return planned{}, err
	}
	return pp, nil
}

// number adds pp to the plan and gives a row, the next cookie, to each of
// its sites whose file, kind and offset no earlier site has; a site that
// one has is merged into that site's row (see "Sites and cookies" in the
// package doc).
func (r *resolver) number(pp planned) {
	pl := r.pl
	fk := fileKind{pp.file.real, pp.probe.Kind}
	seen := r.seen[fk]
	if seen == nil && (r.earlier[fk] || pp.ifuncs != nil) {
		seen = map[uint64]int32{}
		for i, row := range pl.rows {
			if e := &pl.probes[row.probe]; e.file.real == fk.real && e.probe.Kind == fk.kind {
				seen[e.offs[row.k]] = int32(i)
			}
		}
		r.seen[fk] = seen
	}
	r.earlier[fk] = true
	pi := int32(len(pl.probes))
	pl.probes = append(pl.probes, pp)
	pl.rows = slices.Grow(pl.rows, len(pp.offs))
	for k, off := range pp.offs {
		if pp.left[int32(k)] != nil {
			continue
		}
		if seen != nil {
			if i, ok := seen[off]; ok {
				if pl.merged == nil {
					pl.merged = map[int32][]row{}
				}
				pl.merged[i] = append(pl.merged[i], row{probe: pi, k: int32(k)})
				continue
			}
			seen[off] = int32(len(pl.rows))
		}
		pl.rows = append(pl.rows, row{probe: pi, k: int32(k)})
	}
}

// lookupRoot is the root in which target is looked up: with Options.PID,
// the process's own (/proc/PID/root), so that "/app/bin/server" names the
// file a containerized or chrooted process runs; else, or where the
// process shares this one's root, or for a target already under /proc,
// this process's root.
func (pl *Plan) lookupRoot(target string) string {
	if pl.opts.PID == 0 || strings.HasPrefix(target, "/proc/") {
		return ""
	}
	return elfsym.ProcessRoot(pl.opts.PID)
}

// open looks the target up and opens it, once per file.
func (pl *Plan) open(target string) (*openFile, error) {
	path, err := elfsym.LookPathIn(pl.lookupRoot(target), target)
	if err != nil {
		return nil, err
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		real = path
	}
	for _, of := range pl.files {
		if of.real == real {
			return of, nil
		}
	}
	// Not os.Open: a FIFO planted at the path would block it.
	f, err := fds.OpenRegular(pl.runningFile(target, path, real))
	if err != nil {
		return nil, err
	}
	of := &openFile{path: path, real: real, f: f}
	if err := unix.Fstat(int(f.Fd()), &of.st); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	pl.files = append(pl.files, of)
	return of, nil
}

// runningFile is what to open for path, target looked up for
// Options.PID: where path is the process's own executable, the file the
// process runs, /proc/PID/exe. A program replaced by a rename since it
// started (an upgrade, a build, a swap as count's command starts) runs
// the old file, which path no longer names; probes on the new one would
// count nothing, and say nothing.
func (pl *Plan) runningFile(target, path, real string) string {
	pid := pl.opts.PID
	if pid == 0 || strings.HasPrefix(target, "/proc/") {
		return path
	}
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return path
	}
	// The kernel names an executable unlinked since as "PATH (deleted)".
	exe = pl.lookupRoot(target) + strings.TrimSuffix(exe, " (deleted)")
	if exe != path && exe != real {
		return path
	}
	return fmt.Sprintf("/proc/%d/exe", pid)
}

// Close releases the binaries the plan holds open. Links already attached
// stay attached. It may be called more than once.
func (pl *Plan) Close() error {
	var errs []error
	for _, of := range pl.files {
		if err := of.f.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Len returns the number of sites, without building them.
func (pl *Plan) Len() int { return len(pl.rows) }

// Features returns the kernel features the plan decided with.
func (pl *Plan) Features() kernelprobe.Features { return pl.features }

// AttachPath returns the attach path the plan's links take: the kernel's
// mechanism (uprobe_multi, perf-event uprobes), not a file (Site.Path).
func (pl *Plan) AttachPath() kernelprobe.Path { return pl.features.Path() }

// Sites returns the plan's sites; a site's index is its cookie (less
// Options.CookieBase). Each call returns a copy of its own, also after
// Close: what the caller changes in it changes nothing the plan attaches
// (call it once, not per site).
func (pl *Plan) Sites() []Site { return cloneSites(pl.siteTable()) }

// siteTable returns the plan's own sites, built at the first call.
func (pl *Plan) siteTable() []Site {
	pl.sitesOnce.Do(func() { pl.sites = pl.build() })
	return pl.sites
}

// cloneSites copies sites and everything they point to, a site's probe
// once for all its sites, the symbols and USDT sites in one allocation.
func cloneSites(sites []Site) []Site {
	out := slices.Clone(sites)
	var nsym, nusdt int
	for _, s := range sites {
		if s.Symbol != nil {
			nsym++
		}
		if s.USDT != nil {
			nusdt++
		}
	}
	syms, usdts := make([]elfsym.Site, 0, nsym), make([]usdt.Site, 0, nusdt)
	probes := map[*Probe]*Probe{}
	for i := range out {
		s := &out[i]
		if p := s.Probe; p != nil {
			if probes[p] == nil {
				c := *p
				c.Patterns = slices.Clone(p.Patterns)
				probes[p] = &c
			}
			s.Probe = probes[p]
		}
		s.Returns = slices.Clone(s.Returns)
		s.Names = slices.Clone(s.Names)
		if s.Symbol != nil {
			syms = append(syms, *s.Symbol)
			c := &syms[len(syms)-1]
			c.Aliases = slices.Clone(c.Aliases)
			s.Symbol = c
		}
		if s.USDT != nil {
			usdts = append(usdts, *s.USDT)
			c := &usdts[len(usdts)-1]
			c.Args = slices.Clone(c.Args)
			s.USDT = c
		}
	}
	return out
}

// build makes the plan's Sites from its rows; a site's cookie is its index
// plus Options.CookieBase.
func (pl *Plan) build() []Site {
	sites := make([]Site, len(pl.rows))
	var syms []elfsym.Site
	last := int32(-1)
	for i, r := range pl.rows {
		pp := &pl.probes[r.probe]
		s := &sites[i]
		if pp.sel == nil {
			*s = pp.usdt[r.k]
			s.Probe, s.Path, s.Cookie = pp.probe, pp.file.path, pl.opts.CookieBase+uint64(i)
			continue
		}
		if r.probe != last {
			syms, last = pp.ifuncs, r.probe
			if syms == nil {
				syms = pp.sel.Sites()
			}
		}
		// Field by field: copying a whole Site in would go through
		// typedmemmove, which while the GC marks is slow and cannot be
		// preempted, and the GC then spins signalling this thread for the
		// length of the loop.
		sym := &syms[r.k]
		s.Name, s.Offset, s.Symbol = sym.Name, sym.Offset, sym
		s.Probe, s.Path, s.Cookie = pp.probe, pp.file.path, pl.opts.CookieBase+uint64(i)
		if pp.rets != nil {
			s.Returns = pp.rets[r.k]
		}
		s.Moved, s.Note = sym.Moved, sym.Note
	}
	for i, rows := range pl.merged {
		s := &sites[i]
		s.Names = append(s.Names, s.Name)
		for _, r := range rows {
			if n := pl.rowName(r); !slices.Contains(s.Names, n) {
				s.Names = append(s.Names, n)
			}
		}
		if len(s.Names) == 1 {
			s.Names = nil
		}
	}
	return sites
}

// rowName is the name of the site of row r.
func (pl *Plan) rowName(r row) string {
	pp := &pl.probes[r.probe]
	switch {
	case pp.sel == nil:
		return pp.usdt[r.k].Name
	case pp.ifuncs != nil:
		return pp.ifuncs[r.k].Name
	}
	return pp.sel.Sites()[r.k].Name
}

// targets groups the plan's sites of one kind by binary, with the offsets
// and kernel cookies of their rows, without building the Sites; a USDT
// site's kernel cookie is usdtCookie(its index among the USDT rows, its
// cookie). Names are left out but for USDT sites': they are in the Sites.
func (pl *Plan) targets(kind Kind, usdtCookie func(i int, cookie uint64) uint64) []target.Target {
	var targets []target.Target
	index := map[*openFile]int{}
	nusdt := 0
	semaphores := pl.semaphores()
	for cookie, r := range pl.rows {
		pp := &pl.probes[r.probe]
		usdtIndex := -1
		if pp.sel == nil {
			usdtIndex = nusdt
			nusdt++
		}
		if pp.attachAs() != kind {
			continue
		}
		ti, ok := index[pp.file]
		if !ok {
			ti = len(targets)
			index[pp.file] = ti
			targets = append(targets, target.Target{Path: pp.file.path, File: pp.file.f})
		}
		t := &targets[ti]
		if pp.sel == nil && t.Names == nil {
			t.Names = make([]string, len(t.Offsets), cap(t.Offsets))
		}
		off := pp.offs[r.k]
		c, rc, name := pl.opts.CookieBase+uint64(cookie), semaphores[pp.file][off], ""
		if pp.rets != nil {
			rc = 0 // probed at its returns, not at off
		}
		if usdtIndex >= 0 {
			s := &pp.usdt[r.k]
			c, rc, name = usdtCookie(usdtIndex, c), s.RefCtrOffset, s.Name
		}
		if rc != 0 && t.RefCtrOffsets == nil {
			t.RefCtrOffsets = make([]uint64, len(t.Offsets), cap(t.Offsets))
		}
		at := []uint64{off}
		if pp.rets != nil {
			at = pp.rets[r.k] // one cookie for the function's returns
		}
		for _, off := range at {
			t.Offsets = append(t.Offsets, off)
			t.Cookies = append(t.Cookies, c)
			if t.RefCtrOffsets != nil {
				t.RefCtrOffsets = append(t.RefCtrOffsets, rc)
			}
			if t.Names != nil {
				t.Names = append(t.Names, name)
			}
		}
	}
	return targets
}

// semaphores are the USDT semaphores of the plan's USDT sites, by file and
// offset. The kernel keeps one probe per file and offset, with one
// ref-counter offset, and refuses a second probe there with another: a
// function whose first instruction is a USDT probe's (a function that
// only fires it) could not have a uprobe or uretprobe beside the USDT
// probe. Sites at such an offset share the USDT site's semaphore instead,
// which the USDT probe's attachment holds up anyway.
func (pl *Plan) semaphores() map[*openFile]map[uint64]uint64 {
	if !pl.usdt {
		return nil
	}
	var m map[*openFile]map[uint64]uint64
	for i := range pl.probes {
		pp := &pl.probes[i]
		for _, s := range pp.usdt {
			if s.RefCtrOffset == 0 {
				continue
			}
			if m == nil {
				m = map[*openFile]map[uint64]uint64{}
			}
			if m[pp.file] == nil {
				m[pp.file] = map[uint64]uint64{}
			}
			m[pp.file][s.Offset] = s.RefCtrOffset
		}
	}
	return m
}

// attachAs is the kind of link a probe's sites attach through: USDT sites
// attach as entry probes.
func (k Kind) attachAs() Kind {
	if k == USDT {
		return Entry
	}
	return k
}

// preparedSpec is a program spec as Prepare left it, kept for the
// per-site clones that kernels without BPF cookies need.
type preparedSpec struct {
	prog    *ebpf.ProgramSpec
	section *ebpf.MapSpec // .rodata.mp_cookie
	fixed   uint32        // offsets of mp_cookie_fixed and mp_cookie_value in it
	value   uint32
}
