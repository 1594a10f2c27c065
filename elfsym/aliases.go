package elfsym

import (
	"bytes"
	"cmp"
	"debug/elf"
	"encoding/binary"
	"slices"
)

// The aliases: other names at the selected offsets, and which name leads a
// site.

// filter is a bitmap over symbol values that rejects, in one load, almost
// every symbol that is not at a selected address.
type filter struct {
	words []uint64
	shift uint // 64 minus log2 of the number of bits
}

func newFilter(n int) filter {
	// About 16 bits per value keeps false positives near 6%.
	logBits := uint(16)
	for 1<<logBits < 16*n && logBits < 30 {
		logBits++
	}
	return filter{words: make([]uint64, 1<<(logBits-6)), shift: 64 - logBits}
}

func (f *filter) bit(v uint64) (uint64, uint64) {
	b := ((v ^ v>>16 ^ v>>32) * 0x9E3779B97F4A7C15) >> f.shift
	return b >> 6, 1 << (b & 63)
}

func (f *filter) add(v uint64) { w, m := f.bit(v); f.words[w] |= m }

func (f *filter) mayHave(v uint64) bool { w, m := f.bit(v); return f.words[w]&m != 0 }

// aliases adds every other function name at a selected address, so that
// aliases the patterns did not name still fold into their site.
func (r *resolver) aliases() {
	selected := r.n
	if selected == 0 || len(r.f.tables) == 0 {
		return
	}
	values := newFilter(selected)
	for i := range selected {
		values.add(r.hit(i).value)
	}
	// Each part walks its entries again, skipping those it selected.
	r.each(func(p *scanPart) {
		le := binary.LittleEndian
		next := 0
		for t := range r.f.tables {
			tab := &r.f.tables[t]
			lo, hi := max(p.lo, r.bases[t])-r.bases[t], min(p.hi, r.bases[t+1])-r.bases[t]
			for i := lo; i < hi; i++ {
				if next < len(p.found) && int(p.found[next].entry) == r.bases[t]+i {
					next++
					continue
				}
				e := tab.syms[i*symSize : i*symSize+symSize : i*symSize+symSize]
				if !isDefinedFunc(e) || !values.mayHave(le.Uint64(e[8:16])) {
					continue
				}
				off, ok := r.f.FileOffset(le.Uint64(e[8:16]))
				if !ok {
					continue
				}
				if _, found := slices.BinarySearch(r.offsets, off); found {
					p.aliases = append(p.aliases, uint32(r.bases[t]+i))
				}
			}
		}
	})
	le := binary.LittleEndian
	for w := range r.parts {
		t := 0
		for _, g := range r.parts[w].aliases {
			for int(g) >= r.bases[t+1] {
				t++
			}
			i := int(g) - r.bases[t]
			e := r.f.tables[t].syms[i*symSize : i*symSize+symSize : i*symSize+symSize]
			off, _ := r.f.FileOffset(le.Uint64(e[8:16]))
			name, ver, def := r.nameAt(t, i, le.Uint32(e[0:4]))
			r.add(hitAt(e, off, -1, def), name, ver)
		}
	}
	if r.n > selected {
		r.keys = mergeKeys(r.keys, r.sortedKeys(selected, r.n, nil), r)
	}
}

// mergeKeys merges two sorted key lists, a's first among equal offsets.
func mergeKeys(a, b []uint64, r *resolver) []uint64 {
	out := make([]uint64, 0, len(a)+len(b))
	for len(a) > 0 && len(b) > 0 {
		if r.keyOffset(b[0]) < r.keyOffset(a[0]) {
			out, b = append(out, b[0]), b[1:]
		} else {
			out, a = append(out, a[0]), a[1:]
		}
	}
	return append(append(out, a...), b...)
}

// groups yields the keys of the hits at each offset, in offset order.
func (r *resolver) groups(yield func(g []uint64) bool) {
	r.groupsOf(r.keys)(yield)
}

// groupsOf is groups for a run of keys that starts a group.
func (r *resolver) groupsOf(keys []uint64) func(yield func(g []uint64) bool) {
	return func(yield func(g []uint64) bool) {
		for len(keys) > 0 {
			off := r.keyOffset(keys[0])
			n := 1
			for n < len(keys) && r.keyOffset(keys[n]) == off {
				n++
			}
			if !yield(keys[:n:n]) {
				return
			}
			keys = keys[n:]
		}
	}
}

func bindRank(b elf.SymBind) int {
	switch b {
	case elf.STB_GLOBAL, stbGNUUnique:
		return 0
	case elf.STB_WEAK:
		return 1
	default:
		return 2
	}
}

func leadingUnderscores(b []byte) int {
	n := 0
	for n < len(b) && b[n] == '_' {
		n++
	}
	return n
}

// better reports whether a should be a site's primary name rather than b.
func (r *resolver) better(a, b *hit) bool {
	if c := cmp.Compare(bindRank(a.bind()), bindRank(b.bind())); c != 0 {
		return c < 0
	}
	if a.def != b.def {
		return a.def
	}
	an, bn := r.bytes(a.name, a.base), r.bytes(b.name, b.base)
	if c := cmp.Compare(leadingUnderscores(an), leadingUnderscores(bn)); c != 0 {
		return c < 0
	}
	if c := cmp.Compare(len(an), len(bn)); c != 0 {
		return c < 0
	}
	if c := bytes.Compare(an, bn); c != 0 {
		return c < 0
	}
	// One name in .symtab and in .dynsym, as a debug file's .symtab and
	// the library's .dynsym have it: .dynsym's has the version.
	return r.version(a) != "" && r.version(b) == ""
}

// checkExact enforces the rule for exact names: among the definitions of
// one exact name at different offsets, weak ones lose to non-weak ones, and
// two non-weak ones are ambiguous.
func (r *resolver) checkExact() (dropped bool, err error) {
	for pi := range r.m.incl {
		np := &r.m.incl[pi]
		if !np.name.Literal() || (np.version != nil && !np.version.Literal()) {
			continue
		}
		// An exact name's checks read the hits.
		r.collect()
		var strong, weak [][]uint64 // groups
		for g := range r.groups {
			bestBind := -1
			for _, k := range g {
				h := r.hit(r.index(k))
				if int(h.pattern) == pi && (bestBind < 0 || bindRank(h.bind()) < bestBind) {
					bestBind = bindRank(h.bind())
				}
			}
			switch {
			case bestBind < 0:
			case bestBind == 1:
				weak = append(weak, g)
			default:
				strong = append(strong, g)
			}
		}
		if len(strong) == 0 && len(weak) == 0 && !r.named(np) {
			// An exact name is a promise that the function exists:
			// libbpf's attach by a list of names fails the same way,
			// rather than attach the others and say nothing.
			return false, &NoMatchError{Path: r.f.path, Patterns: []string{np.src}, Searched: r.searched,
				Suggestions: (&resolver{f: r.f, m: &matcher{incl: []namePattern{*np}}}).suggest(),
				Stripped:    r.f.stripped()}
		}
		if len(strong) > 1 {
			r.aliases() // for the sites' names
			e := &AmbiguousError{Path: r.f.path, Name: np.src}
			for _, g := range strong {
				e.Sites = append(e.Sites, r.site(g))
			}
			return false, e
		}
		if len(strong) == 1 {
			// The weak definitions are overridden: the loser's group
			// stays only if another pattern selected it too.
			for _, g := range weak {
				for _, k := range g {
					if h := r.hit(r.index(k)); int(h.pattern) == pi {
						h.pattern = -1
						dropped = true
					}
				}
			}
		}
	}
	return dropped, nil
}

// named reports whether some hit bears the exact name np, whichever
// pattern selected it first (an earlier glob may have).
func (r *resolver) named(np *namePattern) bool {
	for g := range r.groups {
		for _, k := range g {
			h := r.hit(r.index(k))
			if h.pattern < 0 {
				continue
			}
			name := []byte(r.str(h.name, h.base))
			if np.match(name, []byte(r.version(h)), h.def) {
				return true
			}
		}
	}
	return false
}

// selected reports whether a pattern selected one of the hits of group g.
func (r *resolver) selected(g []uint64) bool {
	return slices.ContainsFunc(g, func(k uint64) bool { return r.hit(r.index(k)).pattern >= 0 })
}
