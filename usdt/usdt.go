package usdt

import (
	"cmp"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/multiprobe/multiprobe/internal/elfimage"
	"github.com/multiprobe/multiprobe/internal/fds"
	"github.com/multiprobe/multiprobe/internal/glob"
)

// Errors returned by this package, wrapped with the file, probe and spec
// they concern; test them with errors.Is.
var (
	// ErrNoProbes: the file has no USDT probes, or none matching the
	// pattern.
	ErrNoProbes = errors.New("no matching USDT probes")
	// ErrNotELF: the file is not an ELF file at all. It is
	// elfsym.ErrNotELF.
	ErrNotELF = elfimage.ErrNotELF
	// ErrMalformedNote: a .note.stapsdt note is truncated, inconsistent or
	// points outside the binary's loadable segments.
	ErrMalformedNote = errors.New("malformed USDT note")
	// ErrBadArgSpec: an argument string has a form this package does not
	// decode. The probe can be listed but not attached with arguments.
	ErrBadArgSpec = errors.New("bad USDT argument spec")
	// ErrUnsupportedArch: the binary's architecture is not one this
	// package decodes, or (for a Spec) not the host's.
	ErrUnsupportedArch = errors.New("unsupported architecture for USDT")
)

// File is the set of USDT probes of one ELF executable or shared library.
type File struct {
	// Path is the path the file was opened with.
	Path string
	// Arch is the architecture of the file's argument strings.
	Arch Arch

	probes []Probe
}

// Probe is one provider:name pair with every site where it is compiled
// in. A probe in an inlined function has one site per inlined copy.
type Probe struct {
	Provider string `json:"provider"`
	Name     string `json:"name"`
	// Sites are sorted by address, without duplicates.
	Sites []Site `json:"sites"`
	// Semaphore is the virtual address of the probe's semaphore, 0 when
	// it has none, and SemaphoreOffset its file offset: the ref-counter
	// offset for the kernel. They are those of the first site; <sys/sdt.h>
	// gives all sites of a probe one semaphore (provider_name_semaphore).
	Semaphore       uint64 `json:"semaphore,omitempty"`
	SemaphoreOffset uint64 `json:"semaphore_offset,omitempty"`
}

// String returns "provider:name".
func (p Probe) String() string { return p.Provider + ":" + p.Name }

// Site is one place a probe's NOP was compiled to.
type Site struct {
	// Address is the NOP's virtual address, after the .stapsdt.base
	// (prelink) adjustment; Offset its file offset, for the kernel.
	Address uint64 `json:"address"`
	Offset  uint64 `json:"offset"`
	// Semaphore and SemaphoreOffset are as for Probe, for this site.
	Semaphore       uint64 `json:"semaphore,omitempty"`
	SemaphoreOffset uint64 `json:"semaphore_offset,omitempty"`
	// ArgString is the note's argument string, "8@%rdi -4@%esi".
	ArgString string `json:"arg_string"`
	// Args are the decoded arguments; nil when ArgErr is set.
	Args []Arg `json:"args"`
	// ArgErr is why ArgString could not be decoded (wrapping
	// ErrBadArgSpec), nil otherwise. A probe with a bad argument string
	// is still listed; it cannot be given a Spec.
	ArgErr error `json:"-"`
}

// Open reads the USDT notes of the ELF file at path. A file without notes
// is not an error: its Probes returns ErrNoProbes.
func Open(path string) (*File, error) {
	fd, err := fds.OpenRegular(path)
	if err != nil {
		return nil, fmt.Errorf("usdt: %w", err)
	}
	defer fd.Close()
	return OpenFile(fd)
}

// OpenFile is Open for a file the caller has open already, named in errors
// and in File.Path by fd.Name(). It reads the inode fd refers to, whatever
// has happened to its path since, and keeps nothing open: fd stays the
// caller's to close.
func OpenFile(fd *os.File) (*File, error) {
	path := fd.Name()
	// debug/elf would say "bad magic number '[35 33 47 98]'".
	var magic [4]byte
	if n, _ := fd.ReadAt(magic[:], 0); n < len(magic) || string(magic[:]) != elf.ELFMAG {
		return nil, fmt.Errorf("usdt: %s: %w", path, ErrNotELF)
	}
	ef, err := elf.NewFile(fd)
	if err != nil {
		return nil, fmt.Errorf("usdt: %s: %w", path, err)
	}
	f, err := newFile(ef, path)
	if err != nil {
		return nil, fmt.Errorf("usdt: %s: %w", path, err)
	}
	return f, nil
}

// Probes returns the probes whose "provider:name" matches the glob
// pattern (see internal/glob: '*' crosses ':'). A pattern without ':'
// matches the name of any provider; "" matches every probe. It returns
// ErrNoProbes when nothing matches.
func (f *File) Probes(pattern string) ([]Probe, error) {
	if pattern == "" {
		pattern = "*"
	}
	if !strings.Contains(pattern, ":") {
		pattern = "*:" + pattern
	}
	pat, err := glob.Compile(pattern)
	if err != nil {
		return nil, fmt.Errorf("usdt: %s: %w", f.Path, err)
	}
	var out []Probe
	var buf []byte
	for _, p := range f.probes {
		buf = append(append(append(buf[:0], p.Provider...), ':'), p.Name...)
		if pat.Match(buf) {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		if len(f.probes) == 0 {
			return nil, fmt.Errorf("usdt: %s: %w: the file has no .note.stapsdt notes", f.Path, ErrNoProbes)
		}
		msg := fmt.Sprintf("(%d probes in the file)", len(f.probes))
		if near := f.suggest(pattern); len(near) > 0 {
			msg = "(did you mean " + strings.Join(near, ", ") + "?)"
		}
		return nil, fmt.Errorf("usdt: %s: %w for %q %s", f.Path, ErrNoProbes, pattern, msg)
	}
	return out, nil
}

// rawNote is one stapsdt note as stored.
type rawNote struct {
	index                int // position in the section, for error messages
	loc, base, sema      uint64
	provider, name, args string
}

func (n *rawNote) String() string {
	if n.provider == "" && n.name == "" {
		return fmt.Sprintf("note #%d", n.index)
	}
	return fmt.Sprintf("note #%d (%s:%s)", n.index, n.provider, n.name)
}

const (
	noteName = "stapsdt"
	noteType = 3
)

// parseNotes decodes the stapsdt notes of a 64-bit ELF note section.
// Notes of another name or type are skipped, as readelf does.
func parseNotes(data []byte, order binary.ByteOrder, align uint64) ([]rawNote, error) {
	if align != 8 {
		align = 4
	}
	pad := func(n uint64) uint64 { return (n + align - 1) &^ (align - 1) }
	var notes []rawNote
	for off, index := uint64(0), 0; off < uint64(len(data)); index++ {
		rest := uint64(len(data)) - off
		if rest < 12 {
			return nil, fmt.Errorf("%w: note #%d: %d trailing bytes, too short for a note header", ErrMalformedNote, index, rest)
		}
		namesz := uint64(order.Uint32(data[off:]))
		descsz := uint64(order.Uint32(data[off+4:]))
		typ := order.Uint32(data[off+8:])
		nameEnd := 12 + pad(namesz)
		descEnd := nameEnd + pad(descsz)
		if nameEnd > rest || nameEnd+descsz > rest {
			return nil, fmt.Errorf("%w: note #%d: name (%d bytes) and descriptor (%d bytes) run past the section end", ErrMalformedNote, index, namesz, descsz)
		}
		name := data[off+12 : off+12+namesz]
		desc := data[off+nameEnd : off+nameEnd+descsz]
		off += min(descEnd, rest)
		if typ != noteType || string(trimNUL(name)) != noteName {
			continue
		}
		n := rawNote{index: index}
		if len(desc) < 3*8 {
			return nil, fmt.Errorf("%w: note #%d: descriptor of %d bytes is shorter than three addresses", ErrMalformedNote, index, len(desc))
		}
		n.loc = order.Uint64(desc)
		n.base = order.Uint64(desc[8:])
		n.sema = order.Uint64(desc[16:])
		strs := desc[24:]
		var ok bool
		for _, dst := range []*string{&n.provider, &n.name, &n.args} {
			i := indexNUL(strs)
			if i < 0 {
				ok = false
				break
			}
			*dst, strs, ok = string(strs[:i]), strs[i+1:], true
		}
		if !ok {
			return nil, fmt.Errorf("%w: %s: provider, name and argument strings are not NUL-terminated", ErrMalformedNote, &n)
		}
		if n.provider == "" || n.name == "" {
			return nil, fmt.Errorf("%w: %s: empty provider or name", ErrMalformedNote, &n)
		}
		notes = append(notes, n)
	}
	return notes, nil
}

func trimNUL(b []byte) []byte {
	for len(b) > 0 && b[len(b)-1] == 0 {
		b = b[:len(b)-1]
	}
	return b
}

func indexNUL(b []byte) int {
	for i, c := range b {
		if c == 0 {
			return i
		}
	}
	return -1
}

func newFile(ef *elf.File, path string) (*File, error) {
	arch, err := archOf(ef)
	if err != nil {
		return nil, err
	}
	f := &File{Path: path, Arch: arch}
	sec := ef.Section(".note.stapsdt")
	if sec == nil || sec.Type != elf.SHT_NOTE {
		return f, nil
	}
	data, err := sec.Data()
	if err != nil {
		return nil, fmt.Errorf("%w: reading .note.stapsdt: %v", ErrMalformedNote, err)
	}
	notes, err := parseNotes(data, ef.ByteOrder, sec.Addralign)
	if err != nil {
		return nil, err
	}
	var stapBase uint64
	if s := ef.Section(".stapsdt.base"); s != nil {
		stapBase = s.Addr
	}
	syms := &symbols{ef: ef}
	image := elfimage.Load(ef.Progs)
	byName := make(map[string]int)
	for i := range notes {
		n := &notes[i]
		loc := n.loc
		// A prelinked library moved its text but not the notes: the note
		// records where .stapsdt.base was at link time.
		if stapBase != 0 && n.base != 0 {
			loc += stapBase - n.base
		}
		site := Site{Address: loc, Semaphore: n.sema, ArgString: n.args}
		site.Offset, err = image.Offset(loc, true)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: location %#x: %v", ErrMalformedNote, n, loc, err)
		}
		if n.sema != 0 {
			site.SemaphoreOffset, err = image.Offset(n.sema, false)
			if err != nil {
				return nil, fmt.Errorf("%w: %s: semaphore %#x: %v", ErrMalformedNote, n, n.sema, err)
			}
		}
		p := argParser{arch: arch, resolve: syms.lookup, site: loc}
		site.Args, site.ArgErr = p.parse(n.args)
		if site.ArgErr != nil {
			site.ArgErr = fmt.Errorf("usdt: %s: probe %s:%s at %#x: %w", path, n.provider, n.name, loc, site.ArgErr)
		}
		key := n.provider + ":" + n.name
		j, ok := byName[key]
		if !ok {
			j = len(f.probes)
			byName[key] = j
			f.probes = append(f.probes, Probe{Provider: n.provider, Name: n.name})
		}
		f.probes[j].Sites = append(f.probes[j].Sites, site)
	}
	for i := range f.probes {
		p := &f.probes[i]
		slices.SortStableFunc(p.Sites, func(a, b Site) int { return cmp.Compare(a.Address, b.Address) })
		// The same note twice (objects linked twice, LTO) would fire the
		// program twice per hit.
		p.Sites = slices.CompactFunc(p.Sites, func(a, b Site) bool { return a.Address == b.Address })
		p.Semaphore, p.SemaphoreOffset = p.Sites[0].Semaphore, p.Sites[0].SemaphoreOffset
	}
	slices.SortFunc(f.probes, func(a, b Probe) int {
		return cmp.Or(cmp.Compare(a.Provider, b.Provider), cmp.Compare(a.Name, b.Name))
	})
	return f, nil
}

// symbols resolves the symbols named by argument strings. It reads the
// symbol tables only when a string names one, which is rare.
type symbols struct {
	ef     *elf.File
	loaded bool
	addrs  map[string]uint64
}

func (s *symbols) lookup(name string) (uint64, bool) {
	if !s.loaded {
		s.loaded = true
		s.addrs = make(map[string]uint64)
		ambiguous := make(map[string]bool)
		add := func(syms []elf.Symbol, _ error) {
			for _, sym := range syms {
				if sym.Section == elf.SHN_UNDEF || sym.Name == "" {
					continue
				}
				if old, ok := s.addrs[sym.Name]; ok && old != sym.Value {
					// Two static variables of one name in different
					// translation units: the string cannot say which.
					ambiguous[sym.Name] = true
				}
				s.addrs[sym.Name] = sym.Value
			}
		}
		add(s.ef.Symbols())
		add(s.ef.DynamicSymbols())
		for n := range ambiguous {
			delete(s.addrs, n)
		}
	}
	v, ok := s.addrs[name]
	return v, ok
}

// suggest returns up to three probes whose provider:name is closest to
// pattern, for a no-match error: python:function_entry finds
// python:function__entry.
func (f *File) suggest(pattern string) []string {
	// A pattern for a name in any provider ("inlined", which Probes
	// reads as "*:inlined") is compared with names only.
	provider, name, ok := strings.Cut(pattern, ":")
	namesOnly := !ok || provider == "*"
	want := glob.Literal(pattern)
	if namesOnly {
		want = glob.Literal(name)
		if !ok {
			want = glob.Literal(provider)
		}
	}
	limit := max(2, len(want)/3)
	type cand struct {
		name string
		dist int
	}
	var best []cand
	seen := map[string]bool{}
	for _, p := range f.probes {
		full := p.Provider + ":" + p.Name
		if seen[full] {
			continue
		}
		seen[full] = true
		against := full
		if namesOnly {
			against = p.Name
		}
		if d := glob.Distance(want, []byte(against), limit); d <= limit {
			best = append(best, cand{full, d})
		}
	}
	slices.SortStableFunc(best, func(a, b cand) int { return a.dist - b.dist })
	var out []string
	for _, c := range best[:min(len(best), 3)] {
		out = append(out, c.name)
	}
	return out
}
