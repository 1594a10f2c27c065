package elfsym

import (
	"bytes"
	"cmp"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/multiprobe/multiprobe/internal/glob"
)

// A Site is one address a uprobe can attach to.
type Site struct {
	// Name is the primary name at this address: a GLOBAL name before a
	// WEAK one before a LOCAL one, then a default version before another,
	// then fewer leading underscores, then the shorter, then the smaller.
	// A symbol of a non-default version is named "name@VERSION".
	Name string
	// Aliases are the other function names at the same address, sorted.
	Aliases []string
	// Version is the symbol version of Name, if it has one.
	Version string
	Bind    elf.SymBind
	Type    elf.SymType // STT_FUNC or STT_GNU_IFUNC
	Size    uint64
	// Address is the symbol's virtual address as linked.
	Address uint64
	// Offset is the file offset the kernel's uprobe interfaces are given:
	// that of Address, from the PT_LOAD program header that contains it,
	// unless the function's code runs from elsewhere (see Moved).
	Offset uint64
	// SymbolOffset is the file offset of Address.
	SymbolOffset uint64
	// Moved says why Offset is not SymbolOffset, "" when they are equal.
	Moved string
}

// MovedGoStackCheck is Site.Moved for a Go function probed after its
// stack check: runtime.morestack runs a function again from its first
// instruction when its stack grows, so a probe there would count that call
// twice. The arguments are still in their registers there (ABIInternal:
// RAX, RBX, RCX, RDI, RSI, R8-R11 on x86-64). On arm64 functions keep
// their symbols' addresses for now: see goEntry.
const MovedGoStackCheck = "after the Go stack check"

// String returns the site as NAME@OFFSET.
func (s Site) String() string {
	return fmt.Sprintf("%s@%#x", s.Name, s.Offset)
}

// Resolve opens the ELF file at target, resolves patterns in it and closes
// it. target is a path, or a bare library or program name looked up with
// [LookPath].
func Resolve(target string, patterns ...string) ([]Site, error) {
	path, err := LookPath(target)
	if err != nil {
		return nil, err
	}
	f, err := Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Resolve(patterns...)
}

// Resolve returns the sites that patterns select, sorted by file offset.
//
// A pattern selects the function symbols whose name it matches; a pattern
// starting with '!' removes what it matches from the selection, whatever the
// order of the patterns. A site is selected when one of its names is. A
// pattern "name@VERSION" (or "name@@VERSION" for the default version only)
// selects a versioned dynamic symbol; a pattern without '@' matches only
// default and unversioned symbols.
//
// An exact name (no glob characters) defined non-weak at two addresses is an
// *AmbiguousError; a WEAK definition loses to a GLOBAL or LOCAL one. No
// selected site, or an exact name that names no function, is a
// *NoMatchError.
func (f *File) Resolve(patterns ...string) ([]Site, error) {
	s, err := f.Select(patterns...)
	if err != nil {
		return nil, err
	}
	return s.Sites(), nil
}

// A Selection is what patterns select in a file: the sites' file offsets,
// known as soon as Select returns, and the Sites themselves, built when
// first asked for. A caller that needs only offsets first (to hand them to
// the kernel) can build the Sites meanwhile on another CPU: for 100,000
// sites, building them is half of the work.
//
// That work reads the symbol tables again: for the selected symbols' names,
// and for the names the patterns did not select but that share a selected
// address (aliases). Neither changes an offset, and a caller that needs
// only offsets never pays for it. So a Selection keeps the tables mapped,
// after its File is closed too, until it has built its Sites or is
// garbage. Its methods are safe for concurrent use.
type Selection struct {
	r       *resolver
	offsets []uint64
	once    sync.Once
	sites   []Site
	tables  *tablesHold // nil if the Sites need no second reading
	// symOffsets are the symbols' offsets where offsets are not: in a Go
	// binary, offsets are past the stack checks. sizes are the functions'
	// sizes there, and goFile the File, for GoReturns.
	symOffsets []uint64
	sizes      []uint64
	goFile     *File
	ifunc      bool // a selected symbol is an IFUNC
}

// HasIFunc reports whether a selected symbol is an IFUNC (STT_GNU_IFUNC):
// its Site's Address is its resolver's (see package ifunc).
func (s *Selection) HasIFunc() bool { return s.ifunc }

// A tablesHold is a Selection's hold on its File's tables. It is apart from
// the Selection so that a cleanup can release it once the Selection is
// garbage, and released once, by whichever comes first.
type tablesHold struct {
	f    *File
	done atomic.Bool
}

func (h *tablesHold) release() {
	if h.done.CompareAndSwap(false, true) {
		h.f.release()
	}
}

// Select is Resolve without building the Sites: it selects the same sites
// and returns the same errors.
func (f *File) Select(patterns ...string) (*Selection, error) {
	if f.closed {
		return nil, fmt.Errorf("%s: resolve on a closed File", f.path)
	}
	m, err := compile(patterns)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", f.path, err)
	}
	r := &resolver{f: f, m: m}
	r.scan()
	if r.n == 0 && !r.overflow {
		return nil, &NoMatchError{Path: f.path, Patterns: patterns, Searched: r.searched, Suggestions: r.suggest(),
			Stripped: f.stripped()}
	}
	if r.overflow {
		return nil, fmt.Errorf("%s: %w: the selected symbols' names exceed 4 GiB", f.path, ErrUnsupported)
	}
	r.sort()
	dropped, err := r.checkExact()
	if err != nil {
		return nil, err
	}
	s := &Selection{r: r, offsets: r.offsets}
	for w := range r.parts {
		s.ifunc = s.ifunc || r.parts[w].ifunc
	}
	if dropped {
		// Only a weak definition that lost to a strong one leaves an
		// offset without a selected name.
		s.offsets = nil
		for g := range r.groups {
			if r.selected(g) {
				s.offsets = append(s.offsets, r.keyOffset(g[0]))
			}
		}
	}
	if f.goCode != nil {
		s.symOffsets = s.offsets
		s.offsets = goEntries(f, s.offsets)
		// The functions' extents, for GoReturns: a Go binary's
		// selections are small next to a C library's, so their names
		// are read now.
		r.collect()
		s.goFile = f
		for g := range r.groups {
			if r.selected(g) {
				size := uint64(0)
				for _, k := range g {
					size = max(size, r.hit(r.index(k)).size)
				}
				s.sizes = append(s.sizes, size)
			}
		}
	}
	r.m = nil
	if r.n == 0 || len(f.tables) == 0 {
		r.f = nil // nothing to read again: the hits are the Go table's
		return s, nil
	}
	f.hold()
	s.tables = &tablesHold{f: f}
	runtime.AddCleanup(s, (*tablesHold).release, s.tables)
	return s, nil
}

// goEntries returns where the bodies of the Go functions at offsets start
// (see goentry.go), in the same order: each is within its function, so
// the order of the offsets holds. One read a function: a few microseconds
// each, only for Go binaries.
func goEntries(f *File, offsets []uint64) []uint64 {
	out := make([]uint64, len(offsets))
	var buf [goEntryWindow]byte
	for i, off := range offsets {
		n, _ := f.goCode.ReadAt(buf[:], int64(off))
		out[i] = off + uint64(goEntry(f.machine, buf[:n]))
	}
	return out
}

// Len returns the number of sites.
func (s *Selection) Len() int { return len(s.offsets) }

// Offsets returns the file offsets of the sites, sorted: those of Sites,
// in the same order, in a slice of the caller's own.
func (s *Selection) Offsets() []uint64 { return slices.Clone(s.offsets) }

// Sites builds the sites, sorted by file offset, once; later calls return
// the same slice.
func (s *Selection) Sites() []Site {
	s.once.Do(func() {
		if s.r.f != nil {
			s.r.collect()
			s.r.aliases()
			s.r.f = nil
			s.tables.release()
		}
		s.sites = s.r.finish()
		s.r = nil // the hits and keys are garbage now; the names stay
		for i := range s.sites {
			st := &s.sites[i]
			st.SymbolOffset = st.Offset
			if s.symOffsets != nil && s.offsets[i] != st.Offset {
				st.Offset, st.Moved = s.offsets[i], MovedGoStackCheck
			}
		}
	})
	return s.sites
}

// matcher is a compiled set of inclusion and exclusion patterns.
type matcher struct {
	incl, excl []namePattern
}

// namePattern matches a symbol name and, optionally, its version.
type namePattern struct {
	src     string
	name    *glob.Pattern
	version *glob.Pattern // nil: default or unversioned only
	defOnly bool          // "@@": the default version only
	// head and headMask are the first (up to) eight bytes of the name
	// pattern's literal prefix, little-endian, for rejectByPrefix.
	head, headMask uint64
}

func compile(patterns []string) (*matcher, error) {
	if len(patterns) == 0 {
		return nil, fmt.Errorf("%w: no pattern given", ErrBadPattern)
	}
	m := &matcher{}
	for _, p := range patterns {
		exclude := strings.HasPrefix(p, "!")
		src := strings.TrimPrefix(p, "!")
		if src == "" {
			return nil, fmt.Errorf("%w: empty pattern %q", ErrBadPattern, p)
		}
		np := namePattern{src: p}
		namePart, verPart, hasVer := strings.Cut(src, "@")
		if hasVer {
			if strings.HasPrefix(verPart, "@") {
				np.defOnly = true
				verPart = verPart[1:]
			}
			if verPart == "" {
				return nil, fmt.Errorf("%w: %q has an empty version", ErrBadPattern, p)
			}
			v, err := glob.Compile(verPart)
			if err != nil {
				return nil, err
			}
			np.version = v
		}
		n, err := glob.Compile(namePart)
		if err != nil {
			return nil, err
		}
		np.name = n
		var b [8]byte
		k := copy(b[:], n.Prefix())
		np.head = binary.LittleEndian.Uint64(b[:])
		np.headMask = ^uint64(0) >> (64 - 8*k)
		if k == 0 {
			np.headMask = 0
		}
		if exclude {
			m.excl = append(m.excl, np)
		} else {
			m.incl = append(m.incl, np)
		}
	}
	if len(m.incl) == 0 {
		return nil, fmt.Errorf("%w: only exclusions in %q: add a pattern that selects", ErrBadPattern, patterns)
	}
	return m, nil
}

func (np *namePattern) match(name, version []byte, isDefault bool) bool {
	if !np.name.Match(name) {
		return false
	}
	if np.version == nil {
		return isDefault
	}
	if np.defOnly && !isDefault {
		return false
	}
	return np.version.Match(version)
}

// rejectByPrefix reports, without finding the end of the name, that no
// inclusion pattern can match the name at off in strs: most names of a big
// binary fail on their first bytes, and finding each one's NUL would cost
// more than the rest of the scan.
func (m *matcher) rejectByPrefix(strs []byte, off uint32) bool {
	if uint64(off) >= uint64(len(strs)) {
		return true
	}
	rest := strs[off:]
	for i := range m.incl {
		np := &m.incl[i]
		p := np.name.Prefix()
		// The first bytes decide for most names: compare up to eight
		// of them as one integer before calling into bytes.
		if len(p) == 0 {
			return false
		}
		if len(rest) >= 8 && binary.LittleEndian.Uint64(rest)&np.headMask != np.head {
			continue
		}
		if bytes.HasPrefix(rest, p) {
			return false
		}
	}
	return true
}

// candidates returns the string-table offsets at which a name that some
// inclusion pattern could match starts, or nil when the prefix test is
// the better filter (every pattern has a literal prefix) or no filter is
// possible (a pattern such as "*" without any literal part).
//
// A pattern like "*_init" must see every name, and finding the end of
// 200,000 names one at a time costs more than the rest of the scan; one
// bytes.Index pass over the whole table for the pattern's literal part
// finds the few names that contain it.
func (m *matcher) candidates(strs []byte) bitmap {
	prefixed := true
	for i := range m.incl {
		if len(m.incl[i].name.Needle()) == 0 {
			return nil
		}
		if len(m.incl[i].name.Prefix()) == 0 {
			prefixed = false
		}
	}
	if prefixed {
		return nil
	}
	// Each CPU searches a range of the table into a bitmap of its own: a
	// name found near a range's start may begin in the range before.
	workers := min(runtime.GOMAXPROCS(0), len(strs)/parallelStrings+1, 8)
	maps := make([]bitmap, workers)
	var wg sync.WaitGroup
	for w := range maps {
		maps[w] = make(bitmap, (len(strs)+63)/64)
		lo, hi := len(strs)*w/workers, len(strs)*(w+1)/workers
		search := func() {
			for i := range m.incl {
				markNeedle(maps[w], strs, m.incl[i].name.Needle(), lo, hi)
			}
		}
		if workers == 1 {
			search()
		} else {
			wg.Go(search)
		}
	}
	wg.Wait()
	for _, o := range maps[1:] {
		for i, word := range o {
			maps[0][i] |= word
		}
	}
	return maps[0]
}

// parallelStrings is the string table size from which candidates splits
// its search between CPUs.
var parallelStrings = 1 << 20 // a variable for tests

// markNeedle marks in b the names of strs that contain needle at a position
// from lo to hi.
func markNeedle(b bitmap, strs, needle []byte, lo, hi int) {
	// bytes.Index skips ahead to the needle's first byte; '_' or a
	// lowercase letter there would stop it at nearly every name, so
	// search from the needle's rarest-looking byte and check the bytes
	// before it.
	k := anchor(needle)
	end := min(len(strs), hi+len(needle)-1)
	for at := lo + k; at < end; {
		j := bytes.Index(strs[at:end], needle[k:])
		if j < 0 {
			return
		}
		p := at + j - k
		at += j + 1
		if p >= hi {
			return
		}
		if !bytes.Equal(strs[p:p+k], needle[:k]) {
			continue
		}
		// Every name starting between the enclosing string's start and
		// the match contains the needle: the linker may point a symbol
		// into the middle of another's name (tail merging).
		start := bytes.LastIndexByte(strs[:p], 0) + 1
		b.setRange(start, p)
	}
}

// anchor returns the index of the byte of needle least likely to be common
// in symbol names: '_' and lowercase letters are everywhere, digits and
// uppercase letters less so, punctuation rarely.
func anchor(needle []byte) int {
	rank := func(c byte) int {
		switch {
		case c == '_':
			return 0
		case 'a' <= c && c <= 'z':
			return 1
		case '0' <= c && c <= '9':
			return 2
		case 'A' <= c && c <= 'Z':
			return 3
		}
		return 4
	}
	best := 0
	for i := 1; i < len(needle); i++ {
		if rank(needle[i]) > rank(needle[best]) {
			best = i
		}
	}
	return best
}

// bitmap is a set of string-table offsets.
type bitmap []uint64

func (b bitmap) has(off uint32) bool {
	w := off / 64
	return int(w) < len(b) && b[w]&(1<<(off%64)) != 0
}

func (b bitmap) setRange(lo, hi int) {
	for i := lo; i <= hi; i++ {
		b[i/64] |= 1 << (i % 64)
	}
}

// matches returns the index of the first inclusion pattern that selects the
// name, or -1.
func (m *matcher) matches(name, version []byte, isDefault bool) int {
	for i := range m.incl {
		if m.incl[i].match(name, version, isDefault) {
			for j := range m.excl {
				if m.excl[j].match(name, version, isDefault) {
					return -1
				}
			}
			return i
		}
	}
	return -1
}

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

// isDefinedFunc reports whether a raw Elf64_Sym is a defined function with
// an address: the only symbols a uprobe can use. Undefined imports have
// section SHN_UNDEF and value 0; attaching at offset 0 would probe the ELF
// header.
func isDefinedFunc(e []byte) bool {
	typ := elf.SymType(e[4] & 0xf)
	return (typ == elf.STT_FUNC || typ == elf.STT_GNU_IFUNC) &&
		(e[6] != 0 || e[7] != 0) && binary.LittleEndian.Uint64(e[8:16]) != 0
}

// parallelScan is the number of symbols from which scan splits its work
// between CPUs.
var parallelScan = 1 << 15 // a variable for tests

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
		cands[t] = r.m.candidates(r.f.tables[t].strs)
	}
	total := bases[len(r.f.tables)]
	workers := min(runtime.GOMAXPROCS(0), total/parallelScan+1, 8)
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

// sort orders the hits by offset into r.keys and lists the offsets. Each
// part of the scan sorts its own hits, on its own CPU, and the sorted runs
// are merged: for 100,000 hits that halves the time on two CPUs.
func (r *resolver) sort() {
	maxOff := uint64(0)
	if r.collected {
		for i := range r.n {
			maxOff = max(maxOff, r.hit(i).offset)
		}
	} else {
		for w := range r.parts {
			for _, fd := range r.parts[w].found {
				maxOff = max(maxOff, fd.offset)
			}
		}
	}
	// r.packed is decided once, here; hits added later (aliases) are at
	// offsets already seen, so they fit when those did.
	r.packed, r.maxOff = packKeys && r.n < 1<<keyBits && maxOff < 1<<(64-keyBits), maxOff
	if !r.packed {
		r.collect() // the keys are hit indexes: sorting reads the hits
	}
	runs := make([][]uint64, len(r.parts))
	if !r.collected {
		r.each(func(p *scanPart) {
			runs[p.index] = r.sortedKeys(p.hit, p.hit+len(p.found), p.found)
		})
	} else {
		runs = [][]uint64{r.sortedKeys(0, r.n, nil)}
	}
	r.keys = runs[0]
	for _, run := range runs[1:] {
		r.keys = mergeKeys(r.keys, run, r)
	}
	r.offsets = make([]uint64, 0, len(r.keys))
	for _, k := range r.keys {
		if off := r.keyOffset(k); len(r.offsets) == 0 || r.offsets[len(r.offsets)-1] != off {
			r.offsets = append(r.offsets, off)
		}
	}
}

// A key orders a hit: its offset above its index, so that sorting plain
// integers sorts hits by offset, ties in hit order. That is several times
// faster than sorting the 40-byte hits for the 100,000 of a big binary. A
// hit index needs keyBits bits; a file offset must leave them free.
const keyBits = 24

// packKeys is false in tests only, to sort as for a file past packed keys'
// reach: more than 16 million symbols, or offsets past 1 TiB.
var packKeys = true

// keyOffset returns the offset of the hit that k orders.
func (r *resolver) keyOffset(k uint64) uint64 {
	if r.packed {
		return k >> keyBits
	}
	return r.hit(int(k)).offset
}

func (r *resolver) index(k uint64) int {
	if r.packed {
		return int(k & (1<<keyBits - 1))
	}
	return int(k)
}

// sortedKeys returns the keys of hits [lo, hi) sorted by offset. Before
// collect, found are those hits as scan found them.
func (r *resolver) sortedKeys(lo, hi int, found []found) []uint64 {
	keys := make([]uint64, 0, hi-lo)
	if !r.packed {
		// More than 16 million symbols, or offsets past 1 TiB: no real
		// file, but a sort by comparison still gives the right order.
		for i := lo; i < hi; i++ {
			keys = append(keys, uint64(i))
		}
		slices.SortStableFunc(keys, func(a, b uint64) int {
			return cmp.Compare(r.hit(int(a)).offset, r.hit(int(b)).offset)
		})
		return keys
	}
	sorted := true
	for i := lo; i < hi; i++ {
		var off uint64
		if found != nil {
			off = found[i-lo].offset
		} else {
			off = r.hit(i).offset
		}
		k := off<<keyBits | uint64(i)
		sorted = sorted && (len(keys) == 0 || keys[len(keys)-1] < k)
		keys = append(keys, k)
	}
	if !sorted {
		radixSort(keys, bits.Len64(r.maxOff))
	}
	return keys
}

// radixSort sorts keys by their offset bits, keyBits up to keyBits+offBits,
// keeping the order of equal offsets. The keys are distinct and in index
// order, so that is the order of the whole key; an LSD radix sort touches
// each key a few times instead of the log2(n) times of a comparison sort.
func radixSort(keys []uint64, offBits int) {
	if len(keys) < 256 {
		slices.Sort(keys)
		return
	}
	// Digits of up to 12 bits keep the counts in 32 KiB, within a core's
	// L1 or L2 cache; a binary under 16 MiB takes two passes.
	const maxDigit = 12
	passes := max(1, (offBits+maxDigit-1)/maxDigit)
	digit := (offBits + passes - 1) / passes
	mask := uint64(1)<<digit - 1
	count := make([]int, 1<<maxDigit+1)
	tmp := make([]uint64, len(keys))
	src, dst := keys, tmp
	for shift := keyBits; shift < keyBits+offBits; shift += digit {
		clear(count)
		for _, k := range src {
			count[(k>>shift)&mask+1]++
		}
		for i := 1; i < len(count); i++ {
			count[i] += count[i-1]
		}
		for _, k := range src {
			d := (k >> shift) & mask
			dst[count[d]] = k
			count[d]++
		}
		src, dst = dst, src
	}
	if &src[0] != &keys[0] {
		copy(keys, src)
	}
}

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
	return bytes.Compare(an, bn) < 0
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

// parallelSites is the number of sites from which finish splits its work
// between CPUs: below it, starting goroutines costs more than it saves.
var parallelSites = 1 << 14 // a variable for tests

// finish builds the sites, in offset order. With many sites it builds them
// on every CPU, each worker for a run of whole groups, into its part of one
// slice: building 100,000 Sites is a third of a big lookup.
func (r *resolver) finish() []Site {
	sites := make([]Site, len(r.offsets)) // one per group at most
	workers := min(runtime.GOMAXPROCS(0), len(r.offsets)/parallelSites+1, 8)
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
