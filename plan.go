package multiprobe

import (
	"fmt"
	"path/filepath"
	"slices"

	"github.com/multiprobe/multiprobe/attach"
	"github.com/multiprobe/multiprobe/elfsym"
)

// A plan is what Resolve decides before it builds any Site: for each probe,
// its file, what it selected and which of those sites no earlier probe of
// the same file and kind took. Offsets and cookies follow from it, so
// Attach can hand them to the kernel while the Sites are being built.
type plan struct {
	probes []planned
	n      int  // sites over all probes
	usdt   bool // some probe is a USDT probe
}

type planned struct {
	probe *Probe
	path  string
	sel   *elfsym.Selection // a uprobe's sites
	usdt  []Site            // a USDT probe's sites, built already
	// keep says which of the probe's sites are its own; nil: all of them.
	keep []bool
}

// offsets returns the file offsets of the probe's sites, kept or not.
func (p *planned) offsets() []uint64 {
	if p.sel != nil {
		return p.sel.Offsets()
	}
	offs := make([]uint64, len(p.usdt))
	for i, s := range p.usdt {
		offs[i] = s.Offset
	}
	return offs
}

// selectProbes resolves probes to a plan.
func selectProbes(probes []Probe) (*plan, error) {
	if len(probes) == 0 {
		return nil, fmt.Errorf("%w: no probes", ErrBadSpec)
	}
	// Dedup needs a set of offsets only for a file and kind that a second
	// probe selects from; most calls have one probe per file, and hashing
	// 100,000 offsets would cost more than resolving them.
	type fileKind struct {
		path string
		kind Kind
	}
	earlier := map[fileKind][]int{} // indexes into pl.probes
	sets := map[fileKind]map[uint64]bool{}
	files := map[string]*elfsym.File{}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	pl := &plan{}
	// Sites point at their probe: at a copy, not at the caller's slice.
	probes = slices.Clone(probes)
	for i := range probes {
		p := &probes[i]
		path, err := elfsym.LookPath(p.Target)
		if err != nil {
			return nil, fmt.Errorf("probe %s: %w", p, err)
		}
		// Two spellings of one file (a symlink, a library name) share
		// their sites.
		real, err := filepath.EvalSymlinks(path)
		if err != nil {
			real = path
		}
		pp := planned{probe: p, path: path}
		if p.Kind == USDT {
			pl.usdt = true
			pp.usdt, err = resolveUSDT(path, p)
		} else {
			f := files[real]
			if f == nil {
				if f, err = elfsym.Open(path); err != nil {
					return nil, fmt.Errorf("probe %s: %w", p, err)
				}
				files[real] = f
			}
			pp.sel, err = f.Select(p.Patterns...)
		}
		if err != nil {
			return nil, fmt.Errorf("probe %s: %w", p, err)
		}
		offs := pp.offsets()
		fk := fileKind{real, p.Kind}
		seen := sets[fk]
		if seen == nil && len(earlier[fk]) > 0 {
			seen = map[uint64]bool{}
			for _, j := range earlier[fk] {
				e := &pl.probes[j]
				for k, off := range e.offsets() {
					if e.keep == nil || e.keep[k] {
						seen[off] = true
					}
				}
			}
			sets[fk] = seen
		}
		n := len(offs)
		if seen != nil {
			pp.keep, n = make([]bool, len(offs)), 0
			for k, off := range offs {
				if !seen[off] {
					seen[off], pp.keep[k] = true, true
					n++
				}
			}
		}
		earlier[fk] = append(earlier[fk], len(pl.probes))
		pl.probes = append(pl.probes, pp)
		pl.n += n
	}
	return pl, nil
}

// build makes the plan's Sites; a site's cookie is its index.
func (pl *plan) build() []Site {
	sites := make([]Site, 0, pl.n)
	for i := range pl.probes {
		pp := &pl.probes[i]
		if pp.sel == nil {
			for k, s := range pp.usdt {
				if pp.keep == nil || pp.keep[k] {
					s.Probe, s.Path, s.Cookie = pp.probe, pp.path, uint64(len(sites))
					sites = append(sites, s)
				}
			}
			continue
		}
		syms := pp.sel.Sites()
		for k := range syms {
			if pp.keep == nil || pp.keep[k] {
				// Field by field: copying a whole Site in would go
				// through typedmemmove, which while the GC marks is
				// slow and cannot be preempted, and the GC then spins
				// signalling this thread for the length of the loop.
				sites = sites[:len(sites)+1]
				s := &sites[len(sites)-1]
				s.Site, s.Probe, s.Path, s.Cookie = &syms[k], pp.probe, pp.path, uint64(len(sites)-1)
			}
		}
	}
	return sites
}

// targets groups the plan's uprobe sites of one kind by binary, with the
// offsets and cookies that build gives them, without building them. They
// have no names, which are in the Sites only. A probe with a file and kind
// of its own, the common case, hands over its Selection's offsets as they
// are.
func (pl *plan) targets(kind Kind) []attach.Target {
	var targets []attach.Target
	index := map[string]int{}
	cookie := uint64(0)
	for i := range pl.probes {
		pp := &pl.probes[i]
		offs := pp.offsets()
		if pp.probe.Kind.attachAs() != kind {
			cookie += uint64(pp.count(len(offs)))
			continue
		}
		ti, ok := index[pp.path]
		if !ok {
			ti = len(targets)
			index[pp.path] = ti
			targets = append(targets, attach.Target{Path: pp.path})
		}
		t := &targets[ti]
		if pp.keep == nil && t.Offsets == nil {
			// Clipped, so that a later probe of this file appends to
			// a copy rather than into the Selection's array.
			t.Offsets = slices.Clip(offs)
			t.Cookies = make([]uint64, len(offs))
			for j := range t.Cookies {
				t.Cookies[j] = cookie + uint64(j)
			}
			cookie += uint64(len(offs))
			continue
		}
		for j, off := range offs {
			if pp.keep == nil || pp.keep[j] {
				t.Offsets = append(t.Offsets, off)
				t.Cookies = append(t.Cookies, cookie)
				cookie++
			}
		}
	}
	return targets
}

// count returns how many of the probe's n sites it keeps.
func (p *planned) count(n int) int {
	if p.keep == nil {
		return n
	}
	k := 0
	for _, b := range p.keep {
		if b {
			k++
		}
	}
	return k
}
