package multiprobe

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/multiprobe/multiprobe/attach"
	"github.com/multiprobe/multiprobe/fallback"
	"github.com/multiprobe/multiprobe/internal/target"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/usdt"
)

// ErrNotUpdatable: Update was called on a Link whose plan did not have
// Options.Updatable, so its program has no generation check.
var ErrNotUpdatable = errors.New("link has no generation check (resolve with Options.Updatable)")

// Update replaces the link's probe set with pl's, without a gap: the sites
// of pl are attached before the link's old ones are detached (make before
// break), and across the switch every call to a site in both sets is
// counted exactly once, neither missed nor counted by both (see the
// generation check, Options.Updatable). Sites only in the old set stop,
// sites only in pl start; the links of binaries whose sites, cookies and
// file did not change are kept as they are. Afterwards the link's Sites
// are pl's, with pl's cookies; its pid filter and pids stay (change them
// with SetPIDs). On an error before the switch nothing changed; once the
// new set counts it is never undone: an error after it (removing the old
// set's pins, closing its links) says "the new sites are attached, but",
// the Link is pl's, and what could not be removed is left for the next
// Update, Unpin or LoadPinnedLink, which remove it.
//
// pl must be resolved for the same kernel path, with Options.Updatable,
// and prepared for the link's program spec (pl.Prepare(spec)): Update
// loads a copy of the program for the new generation, which shares the
// loaded program's maps; it finds them by ID, which needs CAP_SYS_ADMIN. A return probe of a
// call that entered before Update returns is counted by the old link, if
// it is still attached then: on Linux 6.12+ the kernel runs at a return
// only the consumers that were there at the entry.
//
// A pinned Link stays pinned: the new links and copies are pinned, the
// manifest is replaced, and the pins of what was detached are removed.
func (l *Link) Update(pl *Plan) error {
	return l.update(pl, nil)
}

// UpdateProgram is Update to prog, a new version of the link's program
// (an upgraded agent's): from the switch on, every site of pl runs a copy
// of prog, the old sites' program runs no more, and across the switch
// every call to a site in both sets is counted once, by one program or
// the other (the two versions' copies share the link's generation check).
// No old link is kept, since the old ones run the old code. pl must be
// prepared for prog's spec, and prog's maps are what the new copies use:
// pin the maps the two versions share (cilium/ebpf's MapOptions.PinPath),
// such as their counters, so that prog was loaded with the old version's.
// Afterwards Runs(prog) is true.
func (l *Link) UpdateProgram(pl *Plan, prog *ebpf.Program) error {
	if prog == nil || prog.FD() < 0 {
		return fmt.Errorf("multiprobe: UpdateProgram: no program: %w", attach.ErrWrongProgram)
	}
	return l.update(pl, prog)
}

// update is Update, to program next if not nil.
func (l *Link) update(pl *Plan, next *ebpf.Program) (err error) {
	l.state.Lock()
	defer l.state.Unlock()
	switch {
	case len(l.units) == 0:
		return fmt.Errorf("multiprobe: Update of a closed link: %w", ErrNotUpdatable)
	case l.genState == nil:
		return fmt.Errorf("multiprobe: Update: %w", ErrNotUpdatable)
	case !pl.opts.Updatable:
		return fmt.Errorf("multiprobe: Update with a plan without Options.Updatable: %w", ErrNotUpdatable)
	case pl.features.Path() != l.path:
		return fmt.Errorf("multiprobe: Update: the plan attaches through %v, the link through %v", pl.features.Path(), l.path)
	case pl.kernelPID() != l.kernelPID:
		return fmt.Errorf("multiprobe: Update: the plan's kernel pid filter (%d) is not the link's (%d); the kernel cannot change it", pl.kernelPID(), l.kernelPID)
	}
	for _, of := range pl.files {
		if err := of.changed(); err != nil {
			return err
		}
	}
	prog := l.prog
	if prog == nil && len(l.clones) > 0 {
		prog = l.clones[len(l.clones)-1] // taken back: a copy has the same maps
	}
	nextTag := l.progTag
	if next != nil {
		prog = next
		if nextTag, err = programTag(next); err != nil {
			return err
		}
	}
	maps, err := programMaps(prog, true)
	if err != nil {
		return err
	}
	defer maps.close()

	gen := max(l.gen, l.genFloor) + 1
	usdtCookie, specIDs, err := pl.acquireSpecs(maps)
	if err != nil {
		return err
	}
	keep := map[*unit][]bool{} // the old units' targets that stay
	var added []*unit
	saved, savedLeft := l.filtered, l.leftOut
	l.filtered = nil // entry and return sites of gen share their own copy
	// The sites the kernel refuses are the new set's: a target kept has
	// its plan's sites, none refused, and the others are attached anew.
	l.leftOut = nil
	switched := false
	defer func() {
		if err == nil || switched {
			return
		}
		err = errors.Join(err, closeUnits(added), specIDs.Release(), l.closeCopies(gen), setGenState(l.genState, l.gen, false))
		l.filtered, l.leftOut = saved, savedLeft
	}()
	if err := setGenState(l.genState, l.gen, true); err != nil {
		return err
	}
	for _, kind := range []Kind{Entry, Return} {
		targets := pl.targets(kind, usdtCookie)
		ids := pl.fileIDs(targets)
		var fresh []target.Target
		for i, t := range targets {
			if next != nil || !l.keepTarget(kind, t, ids[i], keep) {
				fresh = append(fresh, t)
			}
		}
		if len(fresh) == 0 {
			continue
		}
		u, err := l.attachUnit(pl, prog, maps, kind, fresh, gen)
		if err != nil {
			return err
		}
		added = append(added, u)
	}

	// The switch, then the calls in flight, then the old links.
	if err := setGenState(l.genState, gen, true); err != nil {
		return err
	}
	// From here the new set is the Link's, whatever fails.
	switched = true
	if next != nil {
		// The user's, as Attach's: the link does not own it (a program
		// taken back from a pin, which it did, its copies' units close).
		if l.ownProg && l.prog != nil {
			l.prog.Close()
		}
		l.prog, l.ownProg = next, false
	}
	l.progTag = nextTag
	errs := []error{l.graceUprobes(added)}
	errs = append(errs, l.retire(pl, gen, keep, added, specIDs)...)
	if err := errors.Join(errs...); err != nil {
		// The new set is attached and counting; what failed is cleaning
		// up after the old one.
		return fmt.Errorf("multiprobe: Update: the new sites are attached, but: %w", err)
	}
	return nil
}

// retire makes the units kept (keep) and added, of generation gen, the
// link's, closes the others and what only they used, and ends the
// update's overlap. It returns what went wrong; the new set counts
// whatever it says.
func (l *Link) retire(pl *Plan, gen uint32, keep map[*unit][]bool, added []*unit, specIDs *usdt.SpecIDs) []error {
	var errs []error
	var units, dropped []*unit
	for _, u := range l.units {
		if k := keep[u]; k != nil {
			units = append(units, u.split(k))
		}
		if len(u.targets()) > 0 {
			dropped = append(dropped, u)
		}
	}
	units = append(units, added...)
	live := map[uint32]bool{}
	for _, u := range units {
		live[u.gen] = true
	}
	gone := slices.DeleteFunc(l.unitGens(), func(g uint32) bool { return live[g] })
	old := l.specIDs
	l.units, l.specIDs, l.plan, l.manifest, l.gen = units, specIDs, pl, nil, gen
	// A copy no unit runs any more is closed here: the dropped links,
	// still attached, hold their program themselves.
	errs = append(errs, l.closeUnused())
	committed := true
	if l.pinDir != "" {
		// The new layout and manifest first: whenever this process
		// stops, the manifest in place describes links that are pinned
		// (see pin_recover.go). If it cannot be replaced, the old set's
		// pins stay for the manifest in place, silent.
		if err := l.repin(); err != nil {
			errs, committed = append(errs, err), false
		}
		errs = append(errs, fault("update: committed"))
	}
	// The generations no unit runs any more fall silent before their
	// links are closed (see generation.go).
	errs = append(errs, retireGens(l.genRetired, gone))
	if l.pinDir != "" && committed {
		for _, u := range dropped {
			// So that Close waits for them: their pins, and the
			// second handles' of a unit an earlier update kept.
			errs = append(errs, u.unpin(), os.RemoveAll(filepath.Join(l.pinDir, u.pinDir)))
		}
		errs = append(errs, fault("update: unpinned"))
	}
	errs = append(errs, closeUnits(dropped), old.Release())
	if l.pinDir != "" && committed {
		errs = append(errs, l.removeOrphans())
	}
	return append(errs, setGenState(l.genState, gen, false))
}

// repin lays the updated link out in its directory: the new program
// copies, every unit in a new directory (a kept one through second
// handles, leaving its old pins in place), then the new manifest in place
// of the old in one rename.
func (l *Link) repin() error {
	dir := l.pinDir
	pins := l.programPins()
	for i, p := range l.programs() {
		if _, err := os.Stat(filepath.Join(dir, pins[i].Pin)); err != nil {
			if err := pinClone(p, filepath.Join(dir, pins[i].Pin)); err != nil {
				return err
			}
		}
	}
	if l.specIDs != nil {
		if _, err := os.Stat(filepath.Join(dir, pinUSDTSpecs)); err != nil {
			if err := l.specIDs.Pin(filepath.Join(dir, pinUSDTSpecs)); err != nil {
				return err
			}
		}
	}
	for _, u := range l.units {
		if err := l.pinUnit(u); err != nil {
			return err
		}
		if err := fault("update: unit pinned"); err != nil {
			return err
		}
	}
	next := filepath.Join(dir, pinManifest+"_next")
	_ = os.Remove(next) // from an update cut short
	if err := writeManifest(l.buildManifest(), next); err != nil {
		return err
	}
	if err := fault("update: commit"); err != nil {
		return err
	}
	return os.Rename(next, filepath.Join(dir, pinManifest))
}

// keepTarget reports whether an old unit of kind holds t as it is (same
// file, offsets, cookies and ref-counter offsets), and marks it kept.
func (l *Link) keepTarget(kind Kind, t target.Target, id fileID, keep map[*unit][]bool) bool {
	for _, u := range l.units {
		if u.kind != kind {
			continue
		}
		for i, ot := range u.targets() {
			f := u.files[i]
			if f.Dev != id.Dev || f.Ino != id.Ino || !slices.Equal(ot.Offsets, t.Offsets) ||
				!slices.Equal(ot.Cookies, t.Cookies) || !slices.Equal(ot.RefCtrOffsets, t.RefCtrOffsets) {
				continue
			}
			if keep[u] == nil {
				keep[u] = make([]bool, len(u.files))
			}
			keep[u][i] = true
			return true
		}
	}
	return false
}

// split moves the targets of u marked in keep into a unit of their own.
func (u *unit) split(keep []bool) *unit {
	k := &unit{kind: u.kind, gen: u.gen, pinDir: u.pinDir}
	var rest []fileID
	for i, f := range u.files {
		if keep[i] {
			k.files = append(k.files, f)
		} else {
			rest = append(rest, f)
		}
	}
	u.files = rest
	if u.multi != nil {
		k.multi = u.multi.Split(func(i int) bool { return keep[i] })
	} else {
		k.perSite = u.perSite.Split(func(i int) bool { return keep[i] })
	}
	return k
}

// closeCopies closes the program copies of generation gen.
func (l *Link) closeCopies(gen uint32) error {
	return l.closeCopiesIf(func(g uint32) bool { return g == gen })
}

// closeUnused closes the program copies that no unit runs any more.
func (l *Link) closeUnused() error {
	used := map[uint32]bool{}
	for _, u := range l.units {
		used[u.gen] = true
	}
	return l.closeCopiesIf(func(g uint32) bool { return !used[g] })
}

func (l *Link) closeCopiesIf(drop func(gen uint32) bool) error {
	var errs []error
	clones, gens := l.clones[:0], l.cloneGens[:0]
	perCopy := 0
	if len(l.clones) > 0 {
		perCopy = l.cloneFDs / len(l.clones)
	}
	for i, p := range l.clones {
		if drop(l.cloneGens[i]) {
			if p == l.filtered {
				l.filtered = nil
			}
			errs = append(errs, p.Close())
			continue
		}
		clones, gens = append(clones, p), append(gens, l.cloneGens[i])
	}
	l.clones, l.cloneGens = clones, gens
	l.cloneFDs = perCopy * len(l.clones)
	return errors.Join(errs...)
}

// graceUprobes returns once every uprobe handler that was running when it
// was called has returned, so that an old link closed next cannot miss a
// call whose new consumer already ran (see generation.go). Detaching a
// uprobe waits for that grace period in the kernel (uprobe_unregister_sync
// since Linux 6.12; before, a handler holds the uprobe's register_rwsem,
// which detaching takes), so it attaches a program that does nothing to
// one site of the link and detaches it again.
func (l *Link) graceUprobes(added []*unit) error {
	var t target.Target
	// The new units' files are open (their plan's); an old unit's may be
	// closed, and then its path names the file.
	pick := func(units []*unit, open bool) {
		for _, u := range units {
			if ts := u.targets(); t.Offsets == nil && len(ts) > 0 && len(ts[0].Offsets) > 0 {
				t = target.Target{Path: ts[0].Path, Offsets: ts[0].Offsets[:1]}
				if open {
					t.File = ts[0].File
				}
				if ts[0].RefCtrOffsets != nil {
					t.RefCtrOffsets = ts[0].RefCtrOffsets[:1]
				}
			}
		}
	}
	pick(added, true)
	pick(l.units, false)
	if t.Offsets == nil {
		return nil
	}
	spec := &ebpf.ProgramSpec{
		Type: ebpf.Kprobe, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	}
	if l.path == kernelprobe.PathUprobeMulti {
		spec.AttachType = ebpf.AttachTraceUprobeMulti
	}
	prog, err := ebpf.NewProgram(spec)
	if err != nil {
		return fmt.Errorf("multiprobe: loading the grace period's program: %w", err)
	}
	defer prog.Close()
	var c interface{ Close() error }
	if l.path == kernelprobe.PathUprobeMulti {
		c, err = attach.UprobeMulti(prog, []target.Target{t}, &attach.Options{Features: &l.features})
	} else {
		c, err = fallback.Uprobes(prog, []target.Target{t}, &fallback.Options{Features: &l.features})
	}
	if err != nil {
		return fmt.Errorf("multiprobe: the grace period's uprobe on %s: %w", t.Path, err)
	}
	return c.Close()
}

// unitGens returns the generations the link's units run, each once.
func (l *Link) unitGens() []uint32 {
	var gens []uint32
	for _, u := range l.units {
		if !slices.Contains(gens, u.gen) {
			gens = append(gens, u.gen)
		}
	}
	return gens
}
