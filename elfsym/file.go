package elfsym

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sync"
	"unsafe"

	"github.com/multiprobe/multiprobe/internal/elfimage"
	"github.com/multiprobe/multiprobe/internal/fds"

	"golang.org/x/sys/unix"
)

const symSize = 24 // sizeof(Elf64_Sym)

// A File is an ELF file opened for symbol resolution. Its methods are safe
// for concurrent use; Close must not race with them.
type File struct {
	path string
	tune tuning // how its lookups split their work; tests change it
	// data is the whole file as the caller gave it to NewFile. Open maps
	// the whole file only to read its headers: maps are the mappings of
	// the tables that Open keeps (see narrow).
	data    []byte
	maps    [][]byte
	closed  bool
	machine elf.Machine
	typ     elf.Type
	entry   uint64 // the ELF header's entry point, a virtual address
	// buildID, debugLink and debugCRC, and debugData point to the file's
	// debug information; debugFile names where its symbols came from.
	buildID   []byte
	debugLink string
	debugCRC  uint32
	debugData []byte
	debugFile string
	image     elfimage.Image
	tables    []symtab // .symtab first, then .dynsym
	// verdef maps a version index (from .gnu.version) to its name.
	verdef map[uint16]string
	// compat is, once a lookup needs it, the functions the tables define
	// only at hidden versions (see compatOnly).
	compatOnce sync.Once
	compat     map[string]bool
	// pclntab and textAddr come from a stripped Go binary.
	pclntab  []byte
	textAddr uint64
	// goCode reads a Go binary's code, for where its functions' bodies
	// start (see goentry.go); nil for other files.
	goCode io.ReaderAt

	// refs counts the holders of the tables' mappings: the File until
	// Close, and each Selection until it has read its names (see
	// Selection). The last to let go unmaps them.
	mu   sync.Mutex
	refs int
}

type symtab struct {
	dynamic bool
	syms    []byte // whole Elf64_Sym entries, the null symbol excluded
	strs    []byte
	versym  []byte // .gnu.version, parallel to syms, for .dynsym only
}

// Open maps the ELF file at path and reads its headers. The symbol tables
// are not read until Resolve. path may be a /proc/PID/root/... path to a
// file in a container.
func Open(path string) (*File, error) {
	fd, err := fds.OpenRegular(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, &notFoundError{err.Error()} // ErrNotFound too, in one line
		}
		return nil, err
	}
	defer fd.Close()
	return OpenFile(fd)
}

// OpenFile is Open for a file the caller has open already, named in errors
// and Sites by fd.Name(). It reads the inode fd refers to, whatever has
// happened to its path since: a caller that opened a binary once, to check
// it and to hand it to the kernel, resolves that very file. fd stays the
// caller's to close, as soon as OpenFile returns if it likes: the File
// keeps a descriptor of its own where it needs one.
//
// A stripped file's symbols are completed from its separate debug file, as
// [OpenFileOptions] describes, under /usr/lib/debug.
func OpenFile(fd *os.File) (*File, error) {
	return OpenFileOptions(fd, nil)
}

// OpenFileOptions is OpenFile with options; opts may be nil.
//
// A file without a .symtab (stripped, as distributions ship binaries)
// exports only some of its functions in .dynsym. Its other symbols are
// read from its debug information where there is some: a .gnu_debugdata
// section (MiniDebugInfo, as Fedora ships: an xz-compressed ELF file
// holding a .symtab), or a separate debug file, found as GDB finds it, by
// the file's build ID under each of opts.DebugDirs
// (DIR/.build-id/xx/yyyy.debug, as Debian's -dbg packages install them)
// or by the name in its .gnu_debuglink section (beside the file, in its
// .debug directory, or under DIR at the file's own directory). A debug
// file must match: the same build ID, or where there is none the
// checksum .gnu_debuglink gives; a stale one fails with an error wrapping
// ErrStaleDebugFile. The offsets still come from the file's own program
// headers.
func OpenFileOptions(fd *os.File, opts *Options) (*File, error) {
	f, err := openFile(fd, false)
	if err != nil {
		return nil, err
	}
	if err := f.addDebugSymbols(fd, opts); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// openFile is OpenFile without the debug file; debug says that fd is one.
func openFile(fd *os.File, debug bool) (*File, error) {
	path := fd.Name()
	st, err := fd.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: %w", path, fds.ErrNotRegular)
	}
	size := st.Size()
	if size < 64 {
		return nil, fmt.Errorf("%s: %w: %d bytes is too short for an ELF header", path, ErrNotELF, size)
	}
	if int64(int(size)) != size {
		return nil, fmt.Errorf("%s: %w: file too large to map", path, ErrUnsupported)
	}
	// Mapping lets a lookup in a 100 MB binary read only the pages of its
	// symbol and string tables.
	data, err := unix.Mmap(int(fd.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("mmap %s: %w", path, err)
	}
	f, err := newFile(path, data, debug)
	if err == nil {
		if err = f.narrow(int(fd.Fd())); err != nil {
			err = fmt.Errorf("mmap %s: %w", path, err)
		}
	}
	// The tables have mappings of their own now, or there was an error.
	if uerr := unix.Munmap(data); err == nil && uerr != nil {
		err = fmt.Errorf("munmap %s: %w", path, uerr)
	}
	if err == nil && f.goCode != nil {
		// Read through a descriptor, not a mapping: see narrow. A
		// duplicate, so that the caller may close fd.
		var dup int
		if dup, err = unix.FcntlInt(fd.Fd(), unix.F_DUPFD_CLOEXEC, 0); err == nil {
			f.goCode = os.NewFile(uintptr(dup), path)
		} else {
			err = fmt.Errorf("dup %s: %w", path, err)
		}
	}
	if err != nil {
		if f != nil {
			f.goCode = nil // still the mapping's reader: nothing to close
			f.Close()
		}
		return nil, err
	}
	return f, nil
}

// NewFile reads an ELF file held in data, named name in errors. data must
// not change while the File is in use.
func NewFile(name string, data []byte) (*File, error) {
	return newFile(name, data, false)
}

// Close releases the File's mappings of the symbol tables. Sites already
// returned stay valid, and so do Selections: one that has not built its
// Sites keeps the tables mapped until it has, or until it is garbage.
func (f *File) Close() error {
	if f == nil {
		return nil
	}
	f.mu.Lock()
	closed := f.closed
	f.closed = true
	f.mu.Unlock()
	if closed {
		return nil
	}
	var err error
	if c, ok := f.goCode.(*os.File); ok {
		err = c.Close()
	}
	return errors.Join(err, f.release())
}

// hold keeps the tables mapped until a matching release.
func (f *File) hold() {
	f.mu.Lock()
	f.refs++
	f.mu.Unlock()
}

// release undoes a hold, or Open's, and unmaps the tables with the last.
func (f *File) release() error {
	f.mu.Lock()
	f.refs--
	if f.refs > 0 {
		f.mu.Unlock()
		return nil
	}
	maps := f.maps
	f.data, f.maps, f.tables, f.pclntab = nil, nil, nil, nil
	f.mu.Unlock()
	var errs []error
	for _, m := range maps {
		errs = append(errs, unix.Munmap(m))
	}
	return errors.Join(errs...)
}

// stripped reports whether the file has no .symtab and no .gopclntab, so
// that only what .dynsym exports can be found.
func (f *File) stripped() bool {
	for _, t := range f.tables {
		if !t.dynamic {
			return false
		}
	}
	return f.pclntab == nil
}

// IsGo reports whether the file is a Go program, whose functions' entry
// sites Select places after their stack check.
func (f *File) IsGo() bool { return f.goCode != nil }

// Path returns the path or name the File was opened with.
func (f *File) Path() string { return f.path }

// BuildID returns the file's GNU build ID (the NT_GNU_BUILD_ID note), nil
// if it has none.
func (f *File) BuildID() []byte { return bytes.Clone(f.buildID) }

// Machine returns the architecture the file was built for.
func (f *File) Machine() elf.Machine { return f.machine }

// Type returns whether the file is an executable (ET_EXEC) or a shared
// object or PIE (ET_DYN).
func (f *File) Type() elf.Type { return f.typ }

// FileOffset converts a virtual address inside an executable PT_LOAD segment
// into the file offset the kernel's uprobe interfaces want.
func (f *File) FileOffset(vaddr uint64) (uint64, bool) { return f.image.Code(vaddr) }

// Entry returns the file offset of the ELF entry point, where the program
// starts (_start; the dynamic loader's own start in ld.so), or false if
// the file has none in its code (a library's e_entry is often 0).
func (f *File) Entry() (uint64, bool) {
	if f.entry == 0 {
		return 0, false
	}
	return f.image.Code(f.entry)
}

func newFile(name string, data []byte, debug bool) (*File, error) {
	ef, err := parseHeaders(name, data)
	if err != nil {
		return nil, err
	}
	f := &File{path: name, data: data, machine: ef.Machine, typ: ef.Type, entry: ef.Entry, refs: 1, tune: defaultTuning}
	f.image = elfimage.Load(ef.Progs)
	if err := f.readDebugRefs(ef); err != nil {
		return nil, err
	}
	// A debug file's segments are the binary's with their contents left
	// out: only its symbol tables are read, and the binary's segments
	// make their offsets.
	if err := f.image.Within(uint64(len(data))); err != nil && !debug {
		// Symbols in such a segment would get offsets the kernel refuses.
		return nil, fmt.Errorf("%s: %w: %w", name, ErrMalformed, err)
	}
	hasSymtab, err := f.readTables(ef)
	if err != nil {
		return nil, err
	}
	if ef.Section(".gopclntab") != nil || ef.Section(".go.buildinfo") != nil {
		f.goCode = bytes.NewReader(data)
	}
	if !hasSymtab {
		if err := f.readGoTable(ef); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// parseHeaders checks that data is a 64-bit little-endian executable or
// shared object and parses its headers.
func parseHeaders(name string, data []byte) (*elf.File, error) {
	if len(data) < 16 || !bytes.HasPrefix(data, []byte(elf.ELFMAG)) {
		return nil, fmt.Errorf("%s: %w", name, ErrNotELF)
	}
	switch elf.Class(data[elf.EI_CLASS]) {
	case elf.ELFCLASS64:
	case elf.ELFCLASS32:
		return nil, fmt.Errorf("%s: %w: 32-bit ELF (only 64-bit files are supported)", name, ErrUnsupported)
	default:
		return nil, fmt.Errorf("%s: %w: bad ELF class %d", name, ErrMalformed, data[elf.EI_CLASS])
	}
	if elf.Data(data[elf.EI_DATA]) != elf.ELFDATA2LSB {
		return nil, fmt.Errorf("%s: %w: big-endian ELF (only little-endian files are supported)", name, ErrUnsupported)
	}
	if err := checkHeaderTables(data); err != nil {
		return nil, fmt.Errorf("%s: %w: %w", name, ErrMalformed, err)
	}
	// debug/elf parses the headers robustly; the symbol tables, which are
	// the bulk of the work, are read in place (readTables).
	ef, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %w", name, ErrMalformed, err)
	}
	if ef.Type != elf.ET_EXEC && ef.Type != elf.ET_DYN {
		return nil, fmt.Errorf("%s: %w: ELF type %s (want an executable or a shared object)", name, ErrUnsupported, ef.Type)
	}
	return ef, nil
}

// readTables finds the symbol tables, .symtab first, then .dynsym with
// its versions, and reports whether there is a .symtab.
func (f *File) readTables(ef *elf.File) (hasSymtab bool, err error) {
	var symtabs, dynsyms []symtab
	var versym, verdef *elf.Section
	for i, s := range ef.Sections {
		switch s.Type {
		case elf.SHT_SYMTAB, elf.SHT_DYNSYM:
			t, err := f.readSymtab(ef, i)
			if err != nil {
				return false, err
			}
			if s.Type == elf.SHT_DYNSYM {
				t.dynamic = true
				dynsyms = append(dynsyms, t)
			} else {
				symtabs = append(symtabs, t)
			}
		case elf.SHT_GNU_VERSYM:
			versym = s
		case elf.SHT_GNU_VERDEF:
			verdef = s
		}
	}
	f.tables = append(symtabs, dynsyms...)
	if skipCoveredDynsym && coveredByTables(symtabs, dynsyms, verdef != nil) {
		f.tables = symtabs
	}
	if versym != nil && len(dynsyms) == 1 && len(f.tables) > len(symtabs) {
		vs, err := f.section(versym)
		if err != nil {
			return false, err
		}
		// versym has one 2-byte entry per dynamic symbol, the null one
		// included; a short table versions only the symbols it covers.
		if len(vs) >= 2 {
			f.tables[len(f.tables)-1].versym = vs[2:]
		}
	}
	if verdef != nil {
		if err := f.readVerdef(ef, verdef); err != nil {
			return false, err
		}
	}
	return len(symtabs) > 0, nil
}

// readGoTable reads the function table of a Go program stripped of its
// .symtab, if it has one.
func (f *File) readGoTable(ef *elf.File) error {
	s := ef.Section(".gopclntab")
	if s == nil || s.Type == elf.SHT_NOBITS {
		return nil
	}
	pcln, err := f.section(s)
	if err != nil {
		return err
	}
	f.pclntab = pcln
	if text := ef.Section(".text"); text != nil {
		f.textAddr = text.Addr
	}
	// A stripped Go program linked with cgo (the race detector links so
	// too) keeps a .dynsym of a few C symbols: its functions are in the
	// Go function table, which is read instead. (Its C functions, which
	// that table lacks, are then not found: a binary stripped of .symtab
	// has no other list of them than .dynsym's exports.)
	f.tables = nil
	return nil
}

// coveredByTables reports whether .symtab holds every function .dynsym
// does, so that .dynsym need not be read: the linker writes every global
// symbol into .symtab, and strip removes .symtab whole. It does not when
// the file defines symbol versions (hasVerdef): .dynsym alone says which
// version a libc function has. A .symtab with fewer entries than .dynsym
// (made by objcopy --keep-symbols or the like) is not trusted either.
// Reading .dynsym too cost node (75,000 dynamic functions, 185,000 in
// .symtab) 1.8 ms of a 6.4 ms 'list' process; TestDynsymCovered checks on
// real binaries that skipping it changes nothing.
// skipCoveredDynsym is turned off by the test that compares the two ways.
var skipCoveredDynsym = true

func coveredByTables(symtabs, dynsyms []symtab, hasVerdef bool) bool {
	if len(symtabs) != 1 || len(dynsyms) != 1 || hasVerdef {
		return false
	}
	return len(symtabs[0].syms) >= len(dynsyms[0].syms)
}

// section returns a section's bytes in place, checking that they lie in the
// file.
func (f *File) section(s *elf.Section) ([]byte, error) {
	if s.Type == elf.SHT_NOBITS {
		return nil, nil
	}
	if s.Offset > uint64(len(f.data)) || s.Size > uint64(len(f.data))-s.Offset {
		return nil, fmt.Errorf("%s: %w: section %s (offset %#x, size %#x) is past the end of the file (%d bytes): truncated?",
			f.path, ErrMalformed, s.Name, s.Offset, s.Size, len(f.data))
	}
	return f.data[s.Offset : s.Offset+s.Size : s.Offset+s.Size], nil
}

func (f *File) readSymtab(ef *elf.File, i int) (symtab, error) {
	s := ef.Sections[i]
	syms, err := f.section(s)
	if err != nil {
		return symtab{}, err
	}
	if s.Entsize != 0 && s.Entsize != symSize {
		return symtab{}, fmt.Errorf("%s: %w: section %s has entry size %d, want %d", f.path, ErrMalformed, s.Name, s.Entsize, symSize)
	}
	if int(s.Link) >= len(ef.Sections) || s.Link == 0 {
		return symtab{}, fmt.Errorf("%s: %w: section %s links to string table %d of %d", f.path, ErrMalformed, s.Name, s.Link, len(ef.Sections))
	}
	strs, err := f.section(ef.Sections[s.Link])
	if err != nil {
		return symtab{}, err
	}
	syms = syms[:len(syms)/symSize*symSize]
	if len(syms) >= symSize {
		syms = syms[symSize:] // the null symbol
	}
	return symtab{syms: syms, strs: strs}, nil
}

// readVerdef reads the names of the versions this file defines. The table is
// a chain of variable-length records; the walk is bounded by the section
// size so that a hostile chain cannot loop.
func (f *File) readVerdef(ef *elf.File, s *elf.Section) error {
	data, err := f.section(s)
	if err != nil {
		return err
	}
	if int(s.Link) >= len(ef.Sections) {
		return fmt.Errorf("%s: %w: .gnu.version_d links to section %d of %d", f.path, ErrMalformed, s.Link, len(ef.Sections))
	}
	strs, err := f.section(ef.Sections[s.Link])
	if err != nil {
		return err
	}
	le := binary.LittleEndian
	f.verdef = make(map[uint16]string)
	off := uint64(0)
	for steps := 0; steps < len(data)/20 && off+20 <= uint64(len(data)); steps++ {
		rec := data[off:]
		ndx := le.Uint16(rec[4:])
		aux := uint64(le.Uint32(rec[12:]))
		next := uint64(le.Uint32(rec[16:]))
		if a := off + aux; aux != 0 && a+8 <= uint64(len(data)) {
			if name, ok := cstring(strs, le.Uint32(data[a:])); ok {
				f.verdef[ndx&0x7fff] = string(name)
			}
		}
		if next == 0 {
			break
		}
		off += next
	}
	return nil
}

// cstring returns the NUL-terminated string at off in strs, in place.
func cstring(strs []byte, off uint32) ([]byte, bool) {
	if uint64(off) >= uint64(len(strs)) {
		return nil, false
	}
	s := strs[off:]
	if i := bytes.IndexByte(s, 0); i >= 0 {
		return s[:i], true
	}
	return nil, false
}

// narrow maps each of the tables a lookup reads on its own, so that Open
// can unmap the rest of the file. A mapping of the whole file would cover
// its code, and registering a uprobe writes the breakpoint into every
// mapping of the file that may execute (a read-only private mapping counts:
// it may be mprotect'ed to exec): with a File open, attaching 100,000 sites
// of its binary took three times as long, the kernel copying our pages.
//
// MAP_POPULATE maps the pages in one call: faulting them in one at a time
// on first touch costs more than the whole scan, on a 200k-symbol binary
// about 2,000 faults.
func (f *File) narrow(fd int) error {
	page := os.Getpagesize()
	base := uintptr(unsafe.Pointer(unsafe.SliceData(f.data)))
	remap := func(b *[]byte) error {
		if len(*b) == 0 {
			return nil
		}
		off := int(uintptr(unsafe.Pointer(&(*b)[0])) - base)
		start := off &^ (page - 1)
		m, err := unix.Mmap(fd, int64(start), off-start+len(*b), unix.PROT_READ, unix.MAP_PRIVATE|mapPopulate)
		if err != nil {
			return err
		}
		f.maps = append(f.maps, m)
		*b = m[off-start : off-start+len(*b) : off-start+len(*b)]
		return nil
	}
	for i := range f.tables {
		t := &f.tables[i]
		for _, b := range []*[]byte{&t.syms, &t.strs, &t.versym} {
			if err := remap(b); err != nil {
				return err
			}
		}
	}
	if err := remap(&f.pclntab); err != nil {
		return err
	}
	f.data = nil
	return nil
}

// checkHeaderTables checks that the program and section header tables the
// ELF header announces fit in the file. debug/elf allocates a record per
// announced entry before reading it, so a 64-byte file claiming 65,535
// sections would otherwise cost megabytes.
func checkHeaderTables(data []byte) error {
	if len(data) < 64 {
		return fmt.Errorf("%d bytes is too short for an ELF header", len(data))
	}
	le := binary.LittleEndian
	fits := func(what string, off uint64, num, entsize uint64) error {
		if num == 0 {
			return nil
		}
		end := off + num*entsize
		if off > uint64(len(data)) || entsize == 0 || num > uint64(len(data))/entsize || end > uint64(len(data)) {
			return fmt.Errorf("%s table (offset %#x, %d entries of %d bytes) is past the end of the file (%d bytes): truncated?",
				what, off, num, entsize, len(data))
		}
		return nil
	}
	phoff, shoff := le.Uint64(data[32:]), le.Uint64(data[40:])
	phentsize, phnum := uint64(le.Uint16(data[54:])), uint64(le.Uint16(data[56:]))
	shentsize, shnum := uint64(le.Uint16(data[58:])), uint64(le.Uint16(data[60:]))
	if err := fits("program header", phoff, phnum, phentsize); err != nil {
		return err
	}
	if shnum == 0 && shoff != 0 {
		// Extended numbering: the count is in the first section header.
		if err := fits("section header", shoff, 1, shentsize); err != nil {
			return err
		}
		if shentsize >= 40 {
			shnum = le.Uint64(data[shoff+32:])
		}
	}
	if err := fits("section header", shoff, shnum, shentsize); err != nil {
		return err
	}
	// debug/elf reads the section name table before anything else, in
	// chunks of up to 10 MB sized by the header's claim: a size past the
	// end of the file would allocate that much before the read fails.
	shstrndx := uint64(le.Uint16(data[62:]))
	if shstrndx == uint64(elf.SHN_XINDEX) && shnum > 0 && shentsize >= 64 {
		shstrndx = uint64(le.Uint32(data[shoff+40:]))
	}
	if shstrndx == 0 || shstrndx >= shnum || shentsize < 64 {
		return nil
	}
	h := data[shoff+shstrndx*shentsize:]
	if elf.SectionFlag(le.Uint64(h[8:]))&elf.SHF_COMPRESSED != 0 {
		// Its size would be the compression header's claim, which
		// debug/elf allocates before decompressing; no toolchain
		// compresses this table.
		return fmt.Errorf("section name table is compressed (flags %#x)", le.Uint64(h[8:]))
	}
	off, size := le.Uint64(h[24:]), le.Uint64(h[32:])
	if elf.SectionType(le.Uint32(h[4:])) != elf.SHT_NOBITS && (off > uint64(len(data)) || size > uint64(len(data))-off) {
		return fmt.Errorf("section name table (offset %#x, size %#x) is past the end of the file (%d bytes): truncated?",
			off, size, len(data))
	}
	return nil
}
