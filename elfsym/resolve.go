package elfsym

import (
	"debug/elf"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
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
	// Moved says where Offset is against SymbolOffset, and why; Note
	// says more where there is more: the resolver's offset and the
	// instructions stepped over for an IFUNC's implementation, why an
	// IFUNC keeps its resolver.
	Moved Move
	Note  string
}

// A Move says where a site's Offset is against its symbol's address.
type Move uint8

const (
	// NotMoved: the site is at its symbol.
	NotMoved Move = iota
	// MovedGoStackCheck: a Go function probed after its stack check:
	// runtime.morestack runs a function again from its first instruction
	// when its stack grows, so a probe there would count that call twice.
	// The arguments are still in their registers there (ABIInternal).
	MovedGoStackCheck
	// MovedIFunc: an IFUNC symbol probed at the implementation that this
	// machine's loader selects, not at its resolver, which runs once per
	// process (package ifunc).
	MovedIFunc
	// KeptIFuncResolver: an IFUNC symbol whose implementation could not be
	// found, probed at its resolver; Note says why.
	KeptIFuncResolver
)

// String says where the site is, as list prints it.
func (m Move) String() string {
	switch m {
	case NotMoved:
		return "at its symbol"
	case MovedGoStackCheck:
		return "after the Go stack check"
	case MovedIFunc:
		return "the IFUNC's implementation on this machine"
	case KeptIFuncResolver:
		return "the IFUNC's resolver, kept"
	}
	return fmt.Sprintf("Move(%d)", uint8(m))
}

// MarshalText makes a Move print by name in JSON.
func (m Move) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalText reads what MarshalText wrote.
func (m *Move) UnmarshalText(text []byte) error {
	for v := range KeptIFuncResolver + 1 {
		if v.String() == string(text) {
			*m = v
			return nil
		}
	}
	return fmt.Errorf("elfsym: %q is not a Move", text)
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
	r := &resolver{f: f, m: m, tune: f.tune}
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
