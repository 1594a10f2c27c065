package elfsym

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"
	"sync"

	"github.com/multiprobe/multiprobe/internal/glob"
)

// The patterns: compiled once, and matched first against whole string tables
// (candidates) so that a symbol whose name cannot match is never read.

// matcher is a compiled set of inclusion and exclusion patterns.
type matcher struct {
	incl, excl []namePattern
	// bare: some inclusion pattern has no version, and so selects a
	// function that has only hidden versions (resolver.compatOnly).
	bare bool
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
			m.bare = m.bare || np.version == nil
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
func (m *matcher) candidates(strs []byte, t *tuning) bitmap {
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
	workers := min(t.procs(), len(strs)/t.parallelStrings+1, 8)
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
