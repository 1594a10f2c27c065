package multiprobe

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
)

// Recovering a pin directory from a process killed in Pin or Update.
//
// The manifest is the commit point of both. Pin writes it last; an Update
// of a pinned Link lays the new set out beside the old (new unit
// directories, new program pins), replaces the manifest in one rename, and
// only then removes the old set's pins. So whenever a process stops, the
// directory is in one of three states, and the next Pin or LoadPinnedLink
// tells them apart:
//
//   - No manifest, but pins: a Pin cut short, its links attached and
//     counting with no owner. Pin and LoadPinnedLink silence them (through
//     the generation check, where there is one) and remove them.
//   - A manifest and pins it does not name beside it: an Update cut short,
//     before its rename (the new set's) or after (the old set's).
//     LoadPinnedLink silences and removes them and sets the generation
//     check back to the manifest's generation, whose copies count; the next
//     Update numbers its generation past the removed ones, which may
//     linger for a moment (see generation.go).
//   - A manifest and what it names: complete.
//
// One process owns a pin directory at a time: a Pin or LoadPinnedLink in a
// directory that another live process is pinning or updating takes its
// half-made layout for a crash's.

// faultAt, set by tests only, is called at the named points of Pin and
// Update where a crash leaves the directory half-made; an error it returns
// fails that step. Tests kill the process there, or inject an error.
var faultAt func(point string) error

// fault calls faultAt at point.
func fault(point string) error {
	if faultAt == nil {
		return nil
	}
	return faultAt(point)
}

// fixedPins are the names of a layout that do not vary.
var fixedPins = []string{pinManifest, pinPIDs, pinAllPIDs, pinUSDTSpecs, pinGenState, pinGenSlots, pinGenRetired}

// ownPin reports whether name is of a pinned Link's layout.
func ownPin(name string) bool {
	return strings.HasPrefix(name, pinUnit) || strings.HasPrefix(name, pinProgram) ||
		strings.HasPrefix(name, pinManifest) || slices.Contains(fixedPins, name)
}

// pinGen returns the generation in the name of a program copy's pin
// (progG_K), and whether it is one.
func pinGen(name string) (uint32, bool) {
	rest, ok := strings.CutPrefix(name, pinProgram)
	g, _, cut := strings.Cut(rest, "_")
	n, err := strconv.ParseUint(g, 10, 32)
	return uint32(n), ok && cut && err == nil
}

// removePins removes names (unit directories with what they hold) from dir.
func removePins(dir string, names []string) error {
	var errs []error
	for _, n := range names {
		errs = append(errs, os.RemoveAll(filepath.Join(dir, n)))
	}
	return errors.Join(errs...)
}

// clearHalfPin removes from dir, which has no manifest, the layout of a Pin
// cut short, after silencing its copies: they are no one's. It reports
// whether there was one.
func clearHalfPin(dir string) (bool, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	var names []string
	var gens []uint32
	for _, e := range ents {
		if !ownPin(e.Name()) {
			continue
		}
		names = append(names, e.Name())
		if g, ok := pinGen(e.Name()); ok {
			gens = append(gens, g)
		}
	}
	if len(names) == 0 {
		return false, nil
	}
	return true, errors.Join(silencePinned(dir, gens), removePins(dir, names))
}

// silencePinned makes the copies of gens count nothing through the
// generation maps pinned in dir: each retired, and the current generation
// past them all. A layout without the maps has no copies that read them.
func silencePinned(dir string, gens []uint32) error {
	if len(gens) == 0 {
		return nil
	}
	state, err := ebpf.LoadPinnedMap(filepath.Join(dir, pinGenState), nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer state.Close()
	retired, err := ebpf.LoadPinnedMap(filepath.Join(dir, pinGenRetired), nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer retired.Close()
	return errors.Join(retireGens(retired, gens), setGenState(state, slices.Max(gens)+1, false))
}

// orphanPins returns the entries of the link's directory that are of a
// layout but that the link's manifest does not name, and the generations
// of the program copies among them.
func (l *Link) orphanPins() (names []string, gens []uint32, err error) {
	ents, err := os.ReadDir(l.pinDir)
	if err != nil {
		return nil, nil, err
	}
	named := map[string]bool{}
	for _, n := range fixedPins {
		named[n] = true
	}
	for _, u := range l.units {
		named[u.pinDir] = true
	}
	for _, p := range l.programPins() {
		named[p.Pin] = true
	}
	for _, e := range ents {
		n := e.Name()
		if !ownPin(n) || named[n] {
			continue
		}
		names = append(names, n)
		if g, ok := pinGen(n); ok {
			gens = append(gens, g)
		}
	}
	return names, gens, nil
}

// removeOrphans removes the pins of the link's directory that its manifest
// does not name: the old set's after an Update, or what an Update cut
// short left, once their generations are silent.
func (l *Link) removeOrphans() error {
	names, _, err := l.orphanPins()
	if err != nil {
		return err
	}
	return removePins(l.pinDir, names)
}

// recoverPins finishes what an Update cut short left beside the manifest
// of a Link just taken back (see the top of this file).
func (l *Link) recoverPins() error {
	names, gens, err := l.orphanPins()
	if err != nil || len(names) == 0 && l.genState == nil {
		return err
	}
	var errs []error
	if l.genState != nil {
		live := l.unitGens()
		var older []uint32
		for _, g := range gens {
			switch {
			case g < l.gen && !slices.Contains(live, g):
				older = append(older, g) // the old set of an Update past its rename
			case g > l.gen:
				l.genFloor = max(l.genFloor, g) // the new set of one before it
			}
		}
		errs = append(errs, retireGens(l.genRetired, older), unretireGens(l.genRetired, live), setGenState(l.genState, l.gen, false))
	}
	errs = append(errs, removePins(l.pinDir, names))
	return errors.Join(errs...)
}

// unretireGens clears the retired mark of gens, the generations a manifest
// names, where one is set: an Update that could not replace the manifest
// retires the old set all the same (the new one counts), and the manifest
// in place still names it for the next process.
func unretireGens(m *ebpf.Map, gens []uint32) error {
	var errs []error
	for _, g := range gens {
		var v uint32
		if err := m.Lookup(g%genRetiredSlots, &v); err != nil {
			errs = append(errs, err)
			continue
		}
		if v == g {
			errs = append(errs, m.Put(g%genRetiredSlots, uint32(0)))
		}
	}
	return errors.Join(errs...)
}
