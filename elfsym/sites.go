package elfsym

import (
	"debug/elf"
	"fmt"
	"slices"
	"sync"
)

// The sites: built from the sorted hits, on several CPUs for many.

// finish builds the sites, in offset order. With many sites it builds them
// on every CPU, each worker for a run of whole groups, into its part of one
// slice: building 100,000 Sites is a third of a big lookup.
func (r *resolver) finish() []Site {
	sites := make([]Site, len(r.offsets)) // one per group at most
	workers := min(r.tune.procs(), len(r.offsets)/r.tune.parallelSites+1, 8)
	if workers <= 1 {
		return sites[:r.fill(sites, r.keys)]
	}
	type part struct{ keys, sites, n int }
	parts := make([]part, 0, workers)
	for w := range workers {
		// Start at a group boundary near an equal share of the keys.
		k := len(r.keys) * w / workers
		for k > 0 && k < len(r.keys) && r.keyOffset(r.keys[k]) == r.keyOffset(r.keys[k-1]) {
			k++
		}
		if len(parts) > 0 && k <= parts[len(parts)-1].keys {
			continue
		}
		g := 0
		if k < len(r.keys) {
			g, _ = slices.BinarySearch(r.offsets, r.keyOffset(r.keys[k]))
		} else {
			g = len(r.offsets)
		}
		parts = append(parts, part{keys: k, sites: g})
	}
	var wg sync.WaitGroup
	for i := range parts {
		end, sitesEnd := len(r.keys), len(sites)
		if i+1 < len(parts) {
			end, sitesEnd = parts[i+1].keys, parts[i+1].sites
		}
		p := &parts[i]
		wg.Go(func() { p.n = r.fill(sites[p.sites:sitesEnd], r.keys[p.keys:end]) })
	}
	wg.Wait()
	// A part has fewer sites than groups only where checkExact dropped a
	// weak definition: close those gaps.
	n := 0
	for _, p := range parts {
		n += copy(sites[n:], sites[p.sites:p.sites+p.n])
	}
	return sites[:n]
}

// fill builds the sites of the groups of keys into sites, which has room
// for one per group, and returns how many it built.
func (r *resolver) fill(sites []Site, keys []uint64) int {
	n := 0
	for g := range r.groupsOf(keys) {
		if r.selected(g) {
			sites[n] = r.site(g)
			n++
		}
	}
	return n
}

// site builds the Site of the hits at one offset. Its name is one that a
// pattern matched, so that uprobe:libc:fread reports fread, not the
// _IO_fread that a glibc alias pass found at the same address; among
// several, the best by [resolver.better].
func (r *resolver) site(g []uint64) Site {
	best := r.hit(r.index(g[0]))
	for _, k := range g[1:] {
		h := r.hit(r.index(k))
		if hm, bm := h.pattern >= 0, best.pattern >= 0; hm != bm {
			if hm {
				best = h
			}
		} else if r.better(h, best) {
			best = h
		}
	}
	site := Site{
		Name:    r.displayName(best),
		Version: r.version(best),
		Bind:    best.bind(),
		Type:    best.typ(),
		Size:    best.size,
		Address: best.value,
		Offset:  best.offset,
	}
	if len(g) == 1 {
		return site
	}
	for _, k := range g {
		h := r.hit(r.index(k))
		if site.Size == 0 {
			site.Size = h.size
		}
		if h.typ() == elf.STT_GNU_IFUNC {
			site.Type = elf.STT_GNU_IFUNC
		}
		if n := r.displayName(h); n != site.Name && !slices.Contains(site.Aliases, n) {
			site.Aliases = append(site.Aliases, n)
		}
	}
	slices.Sort(site.Aliases)
	return site
}

func bindName(b elf.SymBind) string {
	switch b {
	case elf.STB_GLOBAL:
		return "GLOBAL"
	case elf.STB_WEAK:
		return "WEAK"
	case elf.STB_LOCAL:
		return "LOCAL"
	case stbGNUUnique:
		return "UNIQUE"
	}
	return fmt.Sprintf("BIND(%d)", b)
}

// stbGNUUnique is STB_GNU_UNIQUE, which debug/elf does not name: a global
// symbol the dynamic loader keeps unique across the process.
const stbGNUUnique elf.SymBind = 10
