package elfsym

import (
	"bytes"
	"cmp"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
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
	// Offset is the file offset of Address, from the PT_LOAD program header
	// that contains it: what the kernel's uprobe interfaces take.
	Offset uint64
}

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
// selected site is a *NoMatchError.
func (f *File) Resolve(patterns ...string) ([]Site, error) {
	if f.data == nil {
		return nil, fmt.Errorf("%s: resolve on a closed File", f.path)
	}
	m, err := compile(patterns)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", f.path, err)
	}
	r := resolver{f: f, m: m}
	r.scan()
	if len(r.hits) == 0 {
		return nil, &NoMatchError{Path: f.path, Patterns: patterns, Searched: r.searched, Suggestions: r.suggest()}
	}
	sites := r.group()
	if err := r.checkExact(sites); err != nil {
		return nil, err
	}
	return r.finish(sites), nil
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
				return nil, fmt.Errorf("%w: %w", ErrBadPattern, err)
			}
			np.version = v
		}
		n, err := glob.Compile(namePart)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrBadPattern, err)
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
	b := make(bitmap, (len(strs)+63)/64)
	for i := range m.incl {
		needle := m.incl[i].name.Needle()
		// bytes.Index skips ahead to the needle's first byte; '_' or a
		// lowercase letter there would stop it at nearly every name, so
		// search from the needle's rarest-looking byte and check the
		// bytes before it.
		k := anchor(needle)
		for at := k; at < len(strs); {
			j := bytes.Index(strs[at:], needle[k:])
			if j < 0 {
				break
			}
			p := at + j - k
			at += j + 1
			if !bytes.Equal(strs[p:p+k], needle[:k]) {
				continue
			}
			// Every name starting between the enclosing string's start
			// and the match contains the needle: the linker may point a
			// symbol into the middle of another's name (tail merging).
			start := bytes.LastIndexByte(strs[:p], 0) + 1
			b.setRange(start, p)
		}
	}
	return b
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

// sym is one function symbol: a reference to its entry in the mapped file
// and its file offset. It is kept to 16 bytes because a glob over a big
// binary selects hundreds of thousands; the other fields are decoded from
// the entry when a site is built.
type sym struct {
	offset  uint64
	table   uint16
	pattern int16 // the inclusion pattern that selected it, or -1
	index   uint32
}

// entry returns the raw Elf64_Sym of s (nil for a Go function).
func (r *resolver) entry(s sym) []byte {
	if s.table == goTable {
		return nil
	}
	i := int(s.index) * symSize
	return r.f.tables[s.table].syms[i : i+symSize : i+symSize]
}

func (r *resolver) bind(s sym) elf.SymBind {
	if e := r.entry(s); e != nil {
		return elf.SymBind(e[4] >> 4)
	}
	return elf.STB_GLOBAL
}

func (r *resolver) typ(s sym) elf.SymType {
	if e := r.entry(s); e != nil {
		return elf.SymType(e[4] & 0xf)
	}
	return elf.STT_FUNC
}

func (r *resolver) value(s sym) uint64 {
	if e := r.entry(s); e != nil {
		return binary.LittleEndian.Uint64(e[8:])
	}
	return r.goFuncs[s.index].entry
}

func (r *resolver) size(s sym) uint64 {
	if e := r.entry(s); e != nil {
		return binary.LittleEndian.Uint64(e[16:])
	}
	return r.goFuncs[s.index].size
}

type resolver struct {
	f        *File
	m        *matcher
	searched int
	hits     []sym    // symbols the patterns selected, in table order
	sorted   []sym    // the same, by offset
	offsets  []uint64 // their file offsets, sorted and unique
	// goFuncs holds the functions of a stripped Go binary, whose names
	// are not in a string table.
	goFuncs []goFunc
	arena   []byte // see str
}

// symbol decodes entry i of table t, and reports whether it is a defined
// function symbol in an executable segment.
func (r *resolver) symbol(t int, i int) (sym, bool) {
	e := r.f.tables[t].syms[i*symSize : i*symSize+symSize]
	info := e[4]
	typ := elf.SymType(info & 0xf)
	if typ != elf.STT_FUNC && typ != elf.STT_GNU_IFUNC {
		return sym{}, false
	}
	le := binary.LittleEndian
	if elf.SectionIndex(le.Uint16(e[6:])) == elf.SHN_UNDEF {
		return sym{}, false
	}
	value := le.Uint64(e[8:])
	if value == 0 {
		return sym{}, false
	}
	off, ok := r.f.FileOffset(value)
	if !ok {
		return sym{}, false
	}
	return sym{table: uint16(t), index: uint32(i), pattern: -1, offset: off}, true
}

// nameOffset returns where the symbol's name starts in its string table.
func (r *resolver) nameOffset(s sym) uint32 {
	return binary.LittleEndian.Uint32(r.f.tables[s.table].syms[int(s.index)*symSize:])
}

// name returns the symbol's name without version, its version and whether
// that version is the default one, all in place in the mapped file.
func (r *resolver) name(s sym) (name, version []byte, isDefault bool) {
	if s.table == goTable {
		return []byte(r.goFuncs[s.index].name), nil, true
	}
	return r.nameAt(int(s.table), int(s.index), r.nameOffset(s))
}

// nameAt is name for entry i of table t whose name starts at off.
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
	// version, "name@@VER" for the default one.
	if !tab.versioned {
		return name, nil, true
	}
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

// scan reads every function symbol once and keeps those the patterns select.
// It is the hot loop of a lookup in a big binary, so it reads raw entries and
// decodes only candidates.
func (r *resolver) scan() {
	le := binary.LittleEndian
	for t := range r.f.tables {
		syms, strs := r.f.tables[t].syms, r.f.tables[t].strs
		cand := r.m.candidates(strs)
		for i := 0; i+symSize <= len(syms); i += symSize {
			e := syms[i : i+symSize : i+symSize]
			if !isDefinedFunc(e) {
				continue
			}
			r.searched++
			if off := le.Uint32(e[0:4]); cand != nil {
				if !cand.has(off) {
					continue
				}
			} else if r.m.rejectByPrefix(strs, off) {
				continue
			}
			name, ver, def := r.nameAt(t, i/symSize, le.Uint32(e[0:4]))
			p := r.m.matches(name, ver, def)
			if p < 0 {
				continue
			}
			if s, ok := r.symbol(t, i/symSize); ok {
				s.pattern = int16(p)
				r.hits = append(r.hits, s)
			}
		}
	}
	if len(r.f.tables) == 0 && r.f.pclntab != nil {
		r.scanGo()
	}
	// One sort by offset serves the offset set here and the grouping
	// later; r.hits stays in table order, which group walks along.
	r.sorted = sortByOffset(slices.Clone(r.hits))
	r.offsets = make([]uint64, 0, len(r.sorted))
	for _, h := range r.sorted {
		if n := len(r.offsets); n == 0 || r.offsets[n-1] != h.offset {
			r.offsets = append(r.offsets, h.offset)
		}
	}
}

// valueFilter is a small bitmap over symbol values that rejects, in one
// load, almost every symbol that is not at a selected address.
type valueFilter [1 << 10]uint64

func filterBit(v uint64) (int, uint64) {
	h := (v ^ v>>16 ^ v>>32) * 0x9E3779B97F4A7C15
	b := h >> (64 - 16)
	return int(b >> 6), 1 << (b & 63)
}

func (f *valueFilter) add(v uint64) { w, m := filterBit(v); f[w] |= m }

func (f *valueFilter) mayHave(v uint64) bool { w, m := filterBit(v); return f[w]&m != 0 }

// group collects every function name at a selected address, so that aliases
// the patterns did not name still fold into their site, and returns the
// symbols grouped by offset.
func (r *resolver) group() [][]sym {
	var filter valueFilter
	for _, h := range r.hits {
		if h.table != goTable {
			filter.add(r.value(h))
		}
	}
	var extra []sym // other names at selected offsets: aliases
	le := binary.LittleEndian
	next := 0 // r.hits are in table and index order: skip them as the walk meets them
	for t := range r.f.tables {
		syms := r.f.tables[t].syms
		for i := 0; i+symSize <= len(syms); i += symSize {
			if next < len(r.hits) && int(r.hits[next].table) == t && int(r.hits[next].index) == i/symSize {
				next++
				continue
			}
			e := syms[i : i+symSize : i+symSize]
			if !isDefinedFunc(e) || !filter.mayHave(le.Uint64(e[8:16])) {
				continue
			}
			s, ok := r.symbol(t, i/symSize)
			if !ok {
				continue
			}
			if _, found := slices.BinarySearch(r.offsets, s.offset); found {
				extra = append(extra, s)
			}
		}
	}
	all := mergeByOffset(r.sorted, sortByOffset(extra))
	// Every group's offset is one of r.offsets.
	groups := make([][]sym, 0, len(r.offsets))
	for len(all) > 0 {
		n := 1
		for n < len(all) && all[n].offset == all[0].offset {
			n++
		}
		groups = append(groups, all[:n:n])
		all = all[n:]
	}
	return groups
}

// mergeByOffset merges two lists sorted by offset, a's symbols first among
// equal offsets.
func mergeByOffset(a, b []sym) []sym {
	if len(b) == 0 {
		return a
	}
	out := make([]sym, 0, len(a)+len(b))
	for len(a) > 0 && len(b) > 0 {
		if b[0].offset < a[0].offset {
			out, b = append(out, b[0]), b[1:]
		} else {
			out, a = append(out, a[0]), a[1:]
		}
	}
	return append(append(out, a...), b...)
}

// sortByOffset orders symbols by offset, ties in their current order, so
// that grouping is deterministic. It sorts packed integer keys rather than
// the 40-byte records, which is several times faster for the 100,000
// symbols of a big binary; most binaries list symbols in address order
// already and need no sort at all.
func sortByOffset(all []sym) []sym {
	if slices.IsSortedFunc(all, func(a, b sym) int { return cmp.Compare(a.offset, b.offset) }) {
		return all
	}
	const posBits = 24
	if len(all) >= 1<<posBits || slices.ContainsFunc(all, func(s sym) bool { return s.offset >= 1<<(64-posBits) }) {
		slices.SortStableFunc(all, func(a, b sym) int { return cmp.Compare(a.offset, b.offset) })
		return all
	}
	keys := make([]uint64, len(all))
	for i, s := range all {
		keys[i] = s.offset<<posBits | uint64(i)
	}
	slices.Sort(keys)
	sorted := make([]sym, len(all))
	for i, k := range keys {
		sorted[i] = all[k&(1<<posBits-1)]
	}
	return sorted
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

// displayName is a symbol's name as a Site shows it.
func (r *resolver) displayName(s sym) string {
	return r.display(r.name(s))
}

// display is displayName for a name already split from its version.
func (r *resolver) display(name, ver []byte, isDefault bool) string {
	if len(ver) > 0 && !isDefault {
		return r.str(name, at, ver)
	}
	return r.str(name)
}

// str returns the concatenation of parts as a string whose bytes live in an
// arena: resolving 100,000 sites makes one allocation per 64 KiB of names
// instead of one per name. Arena bytes are never written again once a
// string refers to them.
func (r *resolver) str(parts ...[]byte) string {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	if n == 0 {
		return ""
	}
	if cap(r.arena)-len(r.arena) < n {
		r.arena = make([]byte, 0, max(n, 64<<10))
	}
	start := len(r.arena)
	for _, p := range parts {
		r.arena = append(r.arena, p...)
	}
	b := r.arena[start:len(r.arena):len(r.arena)]
	return unsafe.String(&b[0], len(b))
}

var at = []byte("@")

// better reports whether a should be a site's primary name rather than b.
func (r *resolver) better(a, b sym) bool {
	an, _, ad := r.name(a)
	bn, _, bd := r.name(b)
	if c := cmp.Compare(bindRank(r.bind(a)), bindRank(r.bind(b))); c != 0 {
		return c < 0
	}
	if ad != bd {
		return ad
	}
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
func (r *resolver) checkExact(groups [][]sym) error {
	for pi := range r.m.incl {
		np := &r.m.incl[pi]
		if !np.name.Literal() || (np.version != nil && !np.version.Literal()) {
			continue
		}
		var strong, weak []int // group indexes
		for gi, g := range groups {
			bestBind := -1
			for _, s := range g {
				if int(s.pattern) == pi && (bestBind < 0 || bindRank(r.bind(s)) < bestBind) {
					bestBind = bindRank(r.bind(s))
				}
			}
			switch {
			case bestBind < 0:
			case bestBind == 1:
				weak = append(weak, gi)
			default:
				strong = append(strong, gi)
			}
		}
		if len(strong) > 1 {
			e := &AmbiguousError{Path: r.f.path, Name: np.src}
			for _, gi := range strong {
				e.Sites = append(e.Sites, r.site(groups[gi]))
			}
			return e
		}
		if len(strong) == 1 {
			// The weak definitions are overridden: the loser's group
			// stays only if another pattern selected it too.
			for _, gi := range weak {
				g := groups[gi]
				keep := g[:0]
				for _, s := range g {
					if int(s.pattern) == pi {
						s.pattern = -1
					}
					keep = append(keep, s)
				}
				groups[gi] = keep
			}
		}
	}
	return nil
}

func (r *resolver) finish(groups [][]sym) []Site {
	sites := make([]Site, 0, len(groups))
	for _, g := range groups {
		if !slices.ContainsFunc(g, func(s sym) bool { return s.pattern >= 0 }) {
			continue
		}
		sites = append(sites, r.site(g))
	}
	return sites
}

// site builds the Site of one group of symbols at the same offset.
func (r *resolver) site(g []sym) Site {
	best := g[0]
	for _, s := range g[1:] {
		if r.better(s, best) {
			best = s
		}
	}
	name, ver, def := r.name(best)
	site := Site{
		Name:    r.display(name, ver, def),
		Bind:    r.bind(best),
		Type:    r.typ(best),
		Size:    r.size(best),
		Address: r.value(best),
		Offset:  best.offset,
	}
	if len(ver) > 0 {
		site.Version = r.str(ver)
	}
	if len(g) == 1 {
		return site
	}
	for _, s := range g {
		if site.Size == 0 {
			site.Size = r.size(s)
		}
		if r.typ(s) == elf.STT_GNU_IFUNC {
			site.Type = elf.STT_GNU_IFUNC
		}
		if n := r.displayName(s); n != site.Name && !slices.Contains(site.Aliases, n) {
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
