package elfsym

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"math"
	"sync"
	"unsafe"
)

// The scan: every function symbol of the tables, split between CPUs, into
// hits that hold what a Site needs.

// A hit is a function symbol that the patterns selected, or another name at
// a selected offset (an alias), with all that its Site needs. The scan
// decodes it while it reads the entry, in table order: building the sites
// later, in offset order, from the symbol and string tables would revisit
// both at random, which for 100,000 sites costs more than the scan.
type hit struct {
	offset, value, size uint64
	// The name is r.arena[name:name+full]: the bare name (base bytes),
	// then, for a versioned symbol, "@VERSION", or "@@VERSION" for the
	// default version.
	name, full, base uint32
	pattern          int16 // the inclusion pattern that selected it, or -1
	info             uint8 // st_info: bind<<4 | type
	def              bool  // unversioned, or the default version
}

func (h *hit) bind() elf.SymBind { return elf.SymBind(h.info >> 4) }
func (h *hit) typ() elf.SymType  { return elf.SymType(h.info & 0xf) }

// hitChunk is how many hits one allocation holds. Hits live in chunks, so
// that the aliases appended after the scan's exactly sized allocation do
// not copy 100,000 hits into a grown slice.
const hitChunk = 1 << 12

type resolver struct {
	f        *File
	m        *matcher
	tune     tuning // the File's, kept past the scan (finish runs without the File)
	searched int
	// hits are the selected symbols, in table and index order, then the
	// aliases the alias pass adds.
	hits [][]hit
	n    int
	// keys are the hits sorted by offset, ties in hit order (selected
	// before aliases); see keyBits.
	keys    []uint64
	packed  bool
	maxOff  uint64   // of the selected hits
	offsets []uint64 // the selected file offsets, sorted and unique
	// arena holds the names of every hit. Sites' strings point into it,
	// so it is only appended to, and strings are made from it only once
	// the last hit is in (finish).
	arena    []byte
	overflow bool // the names exceed what a hit's uint32 offsets address
	// collected: the hits and arena are written (see scan). arenaSize is
	// the arena's size, which scan counts.
	collected bool
	arenaSize int
	// parts are scan's ranges of entries, numbered from bases[t] in table
	// t, which the alias pass walks again.
	parts []scanPart
	bases []int
}

// each runs f for every part, on a goroutine each if there are several.
func (r *resolver) each(f func(p *scanPart)) {
	if len(r.parts) == 1 {
		f(&r.parts[0])
		return
	}
	var wg sync.WaitGroup
	for w := range r.parts {
		wg.Go(func() { f(&r.parts[w]) })
	}
	wg.Wait()
}

func (r *resolver) hit(i int) *hit { return &r.hits[i/hitChunk][i%hitChunk] }

// add appends a hit for the symbol named name (version ver).
func (r *resolver) add(h hit, name, ver []byte) {
	n := nameSize(name, ver, h.def)
	if uint64(len(r.arena))+uint64(n) > math.MaxUint32 {
		r.overflow = true
		return
	}
	if need := len(r.arena) + n; need > cap(r.arena) {
		// Double, as append does not for big slices: at its 1.25 it
		// would allocate five times the final size on the way there.
		a := make([]byte, len(r.arena), max(2*cap(r.arena), need, 256))
		copy(a, r.arena)
		r.arena = a
	}
	at := len(r.arena)
	r.arena = r.arena[:at+n]
	h.name, h.base, h.full = uint32(at), uint32(len(name)), uint32(n)
	putName(r.arena[at:], name, ver, h.def)
	// A partial last chunk starts small and doubles, so that a lookup of
	// a few names allocates little; the others are allocated whole.
	last := len(r.hits) - 1
	switch {
	case last < 0:
		r.hits = append(r.hits, make([]hit, 0, 8))
		last = 0
	case len(r.hits[last]) == hitChunk:
		r.hits = append(r.hits, make([]hit, 0, hitChunk))
		last++
	case len(r.hits[last]) == cap(r.hits[last]):
		c := make([]hit, len(r.hits[last]), min(hitChunk, 2*cap(r.hits[last])))
		copy(c, r.hits[last])
		r.hits[last] = c
	}
	r.hits[last] = append(r.hits[last], h)
	r.n++
}

// nameSize is how many arena bytes a name takes: the name, then for a
// versioned one "@VERSION" or "@@VERSION".
func nameSize(name, ver []byte, def bool) int {
	switch {
	case len(ver) == 0:
		return len(name)
	case def:
		return len(name) + 2 + len(ver)
	}
	return len(name) + 1 + len(ver)
}

// putName writes a name as nameSize counts it.
func putName(dst, name, ver []byte, def bool) {
	n := copy(dst, name)
	if len(ver) == 0 {
		return
	}
	dst[n] = '@'
	n++
	if def {
		dst[n] = '@'
		n++
	}
	copy(dst[n:], ver)
}

// hitAt makes the hit of the function symbol whose raw entry is e and whose
// file offset is off.
func hitAt(e []byte, off uint64, pattern int, def bool) hit {
	le := binary.LittleEndian
	return hit{
		offset:  off,
		value:   le.Uint64(e[8:16]),
		size:    le.Uint64(e[16:24]),
		pattern: int16(pattern),
		info:    e[4],
		def:     def,
	}
}

// str returns arena bytes as a string that shares them.
func (r *resolver) str(off, n uint32) string {
	if n == 0 {
		return ""
	}
	return unsafe.String(&r.arena[off], n)
}

// bytes returns arena bytes, for comparisons.
func (r *resolver) bytes(off, n uint32) []byte { return r.arena[off : off+n : off+n] }

// displayName is the name a Site shows: "name@VERSION" for a non-default
// version, the bare name otherwise.
func (r *resolver) displayName(h *hit) string {
	if h.def {
		return r.str(h.name, h.base)
	}
	return r.str(h.name, h.full)
}

// version returns the hit's version, "" for none.
func (r *resolver) version(h *hit) string {
	skip := uint32(1) // "@"
	if h.def {
		skip = 2 // "@@"
	}
	if h.full <= h.base+skip {
		return ""
	}
	return r.str(h.name+h.base+skip, h.full-h.base-skip)
}

// funcAt reports whether entry i of table t is a function symbol with an
// address in an executable segment, and its file offset.
func (r *resolver) funcAt(t, i int) (e []byte, off uint64, ok bool) {
	e = r.f.tables[t].syms[i*symSize : i*symSize+symSize : i*symSize+symSize]
	if !isDefinedFunc(e) {
		return nil, 0, false
	}
	off, ok = r.f.FileOffset(binary.LittleEndian.Uint64(e[8:16]))
	return e, off, ok
}

// nameAt returns the name of entry i of table t, which starts at off in its
// string table, without its version; the version; and whether that version
// is the default one. All are in place in the mapped file.
func (r *resolver) nameAt(t, i int, off uint32) (name, version []byte, isDefault bool) {
	tab := &r.f.tables[t]
	name, _ = cstring(tab.strs, off)
	if tab.dynamic {
		if vs := tab.versym; i*2+2 <= len(vs) {
			v := binary.LittleEndian.Uint16(vs[i*2:])
			// Indexes 0 and 1 are "local" and "global, unversioned".
			if ndx := v & 0x7fff; ndx >= 2 {
				if vn, ok := r.f.verdef[ndx]; ok {
					return name, []byte(vn), v&0x8000 == 0
				}
			}
		}
		return name, nil, true
	}
	// In .symtab a versioned name is spelled out: "name@VER" for a hidden
	// version, "name@@VER" for the default one. (Looking for an '@' in the
	// names read is cheaper than in the whole table up front: on node's
	// 10 MB of names that took 0.6 ms of a 4.7 ms lookup.)
	if i := bytes.IndexByte(name, '@'); i >= 0 {
		version = name[i+1:]
		isDefault = bytes.HasPrefix(version, []byte("@"))
		if isDefault {
			version = version[1:]
		}
		return name[:i], version, isDefault
	}
	return name, nil, true
}

// compatOnly reports whether the file defines the function name only at
// hidden versions: no default version (name@@V) and no unversioned
// symbol. glibc keeps such functions for binaries linked against an old
// version (fattach@GLIBC_2.2.5, __nss_next@GLIBC_2.2.5). The set is made
// the first time a hidden version's name matches a pattern: a pass over
// the functions' names, which most lookups never need.
func (r *resolver) compatOnly(name []byte) bool {
	f := r.f
	f.compatOnce.Do(func() {
		hidden, plain := map[string]bool{}, map[string]bool{}
		for t := range f.tables {
			for i := range len(f.tables[t].syms) / symSize {
				e, _, ok := r.funcAt(t, i)
				if !ok {
					continue
				}
				n, ver, def := r.nameAt(t, i, binary.LittleEndian.Uint32(e[0:4]))
				if def {
					plain[string(n)] = true
				} else if len(ver) > 0 {
					hidden[string(n)] = true
				}
			}
		}
		f.compat = map[string]bool{}
		for n := range hidden {
			if !plain[n] {
				f.compat[n] = true
			}
		}
	})
	return f.compat[string(name)]
}

// isDefinedFunc reports whether a raw Elf64_Sym is a defined function with
// an address: the only symbols a uprobe can use. Undefined imports have
// section SHN_UNDEF and value 0; attaching at offset 0 would probe the ELF
// header.
func isDefinedFunc(e []byte) bool {
	typ := elf.SymType(e[4] & 0xf)
	return (typ == elf.STT_FUNC || typ == elf.STT_GNU_IFUNC) &&
		(e[6] != 0 || e[7] != 0) && binary.LittleEndian.Uint64(e[8:16]) != 0
}

// A scanPart is a range of symbol entries that one CPU scans. Entries are
// numbered across the tables, .symtab first.
type scanPart struct {
	lo, hi          int
	searched, bytes int
	found           []found  // the entries selected, in order
	index           int      // in resolver.parts
	hit, arena      int      // where the part's hits and names start
	aliases         []uint32 // entries at selected offsets, not selected
	ifunc           bool     // some entry selected is an IFUNC
}

type found struct {
	offset  uint64 // the symbol's file offset, for sort before collect
	entry   uint32
	pattern int16
}

// scan reads every function symbol and keeps those the patterns select. It
// is the hot loop of a lookup in a big binary, so it reads raw entries and
// decodes only candidates. It is the first of two passes, each on every CPU
// over a range of the entries: scan decides which symbols are selected,
// with their offsets, and counts their names' bytes; collect, later, writes
// their hits and names, each range into its part of storage allocated once,
// at its exact size. The offsets are all the kernel needs, so collect waits
// until something needs names (see Selection): writing 100,000 hits and
// their names is a third of the lookup.
func (r *resolver) scan() {
	if len(r.f.tables) == 0 {
		// A Go function table is small and read whole: its hits are
		// written as they are found.
		r.collected = true
		if r.f.pclntab != nil {
			r.scanGo()
		}
		return
	}
	bases := make([]int, len(r.f.tables)+1)
	cands := make([]bitmap, len(r.f.tables))
	for t := range r.f.tables {
		bases[t+1] = bases[t] + len(r.f.tables[t].syms)/symSize
		cands[t] = r.m.candidates(r.f.tables[t].strs, &r.tune)
	}
	total := bases[len(r.f.tables)]
	workers := min(r.tune.procs(), total/r.tune.parallelScan+1, 8)
	parts := make([]scanPart, workers)
	for w := range parts {
		parts[w].lo, parts[w].hi, parts[w].index = total*w/workers, total*(w+1)/workers, w
	}
	r.parts, r.bases = parts, bases
	r.each(func(p *scanPart) { r.find(p, bases, cands) })
	n, bytes := 0, 0
	for w := range parts {
		p := &parts[w]
		p.hit, p.arena = n, bytes
		n, bytes, r.searched = n+len(p.found), bytes+p.bytes, r.searched+p.searched
	}
	if n == 0 {
		return
	}
	if uint64(bytes) > math.MaxUint32 {
		r.overflow = true
		return
	}
	r.n, r.arenaSize = n, bytes
}

// collect writes the hits and names of what scan selected, once.
func (r *resolver) collect() {
	if r.collected {
		return
	}
	r.collected = true
	n := r.n
	r.arena = make([]byte, r.arenaSize)
	r.hits = make([][]hit, (n+hitChunk-1)/hitChunk)
	for c := range r.hits {
		r.hits[c] = make([]hit, min(hitChunk, n-c*hitChunk))
	}
	r.each(r.collectPart)
}

// find is scan's first pass over part p.
func (r *resolver) find(p *scanPart, bases []int, cands []bitmap) {
	le := binary.LittleEndian
	for t := range r.f.tables {
		tab := &r.f.tables[t]
		cand := cands[t]
		lo, hi := max(p.lo, bases[t])-bases[t], min(p.hi, bases[t+1])-bases[t]
		for i := lo; i < hi; i++ {
			e := tab.syms[i*symSize : i*symSize+symSize : i*symSize+symSize]
			if !isDefinedFunc(e) {
				continue
			}
			p.searched++
			if off := le.Uint32(e[0:4]); cand != nil {
				if !cand.has(off) {
					continue
				}
			} else if r.m.rejectByPrefix(tab.strs, off) {
				continue
			}
			name, ver, def := r.nameAt(t, i, le.Uint32(e[0:4]))
			pat := r.m.matches(name, ver, def)
			if pat < 0 && !def && r.m.bare && r.compatOnly(name) {
				// A function with only a compat version
				// (fattach@GLIBC_2.2.5): a pattern without '@'
				// means it too, as old binaries still call it.
				pat = r.m.matches(name, nil, true)
			}
			if pat < 0 {
				continue
			}
			if off, ok := r.f.FileOffset(le.Uint64(e[8:16])); ok {
				if len(p.found) == cap(p.found) {
					// Doubling; see add.
					p.found = append(make([]found, 0, max(64, 2*cap(p.found))), p.found...)
				}
				p.found = append(p.found, found{offset: off, entry: uint32(bases[t] + i), pattern: int16(pat)})
				p.ifunc = p.ifunc || elf.SymType(e[4]&0xf) == elf.STT_GNU_IFUNC
				p.bytes += nameSize(name, ver, def)
			}
		}
	}
}

// collectPart is collect's pass over part p.
func (r *resolver) collectPart(p *scanPart) {
	le := binary.LittleEndian
	h, at, t := p.hit, p.arena, 0
	for _, fd := range p.found {
		g := int(fd.entry)
		for g >= r.bases[t+1] {
			t++
		}
		i := g - r.bases[t]
		e := r.f.tables[t].syms[i*symSize : i*symSize+symSize : i*symSize+symSize]
		name, ver, def := r.nameAt(t, i, le.Uint32(e[0:4]))
		hp := r.hit(h)
		*hp = hitAt(e, fd.offset, int(fd.pattern), def)
		size := nameSize(name, ver, def)
		hp.name, hp.base, hp.full = uint32(at), uint32(len(name)), uint32(size)
		putName(r.arena[at:at+size], name, ver, def)
		h, at = h+1, at+size
	}
}
