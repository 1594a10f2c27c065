package procmaps

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"unicode"

	"golang.org/x/sys/unix"
)

var (
	// ErrNeedPID: the sites of a position-independent binary (PIE
	// executable or shared library) have no address until a process maps
	// it, so a pid must name one.
	ErrNeedPID = errors.New("position-independent binary: its addresses depend on the process, which needs a pid")
	// ErrNotMapped: the process does not map the site's part of the
	// binary (not loaded yet, or another binary).
	ErrNotMapped = errors.New("binary not mapped by the process")
	// ErrNotLoadable: the file is not an executable or shared object, or
	// an offset lies in no PT_LOAD segment.
	ErrNotLoadable = errors.New("offset not in a loadable segment")
)

// Read returns the mappings of process pid.
func Read(pid int) ([]Mapping, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/maps")
	if err != nil {
		return nil, fmt.Errorf("process %d: %w", pid, err)
	}
	return Parse(data), nil
}

// RuntimeAddrs turns file offsets into the addresses the instruction
// pointer holds when the sites' uprobes fire: the probed address, to which
// the kernel rewinds the ip before it runs the program.
func RuntimeAddrs(path string, offs []uint64, pid int) ([]uint64, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("procmaps: %s: %w", path, err)
	}
	defer f.Close()
	out := make([]uint64, len(offs))
	switch f.Type {
	case elf.ET_EXEC:
		// Loaded at its link-time addresses in every process.
		for i, off := range offs {
			a, ok := vaddrOf(f.Progs, off)
			if !ok {
				return nil, fmt.Errorf("procmaps: %s: offset %#x is in no PT_LOAD segment: %w", path, off, ErrNotLoadable)
			}
			out[i] = a
		}
		return out, nil
	case elf.ET_DYN:
	default:
		return nil, fmt.Errorf("procmaps: %s: ELF type %v is neither an executable nor a shared object: %w", path, f.Type, ErrNotLoadable)
	}
	if pid == 0 {
		return nil, fmt.Errorf("procmaps: %s: %w: name the process that loads it", path, ErrNeedPID)
	}
	maps, err := Read(pid)
	if err != nil {
		return nil, fmt.Errorf("procmaps: load address of %s: %w", path, err)
	}
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("procmaps: %w", err)
	}
	real, _ := filepath.EvalSymlinks(path)
	var mine []Mapping
	for _, m := range maps {
		if sameFile(m, st, real) {
			mine = append(mine, m)
		}
	}
	for i, off := range offs {
		a, ok := addrIn(mine, off)
		if !ok {
			return nil, fmt.Errorf("procmaps: %s: offset %#x: process %d: %w (has it loaded the library yet?)", path, off, pid, ErrNotMapped)
		}
		out[i] = a
	}
	return out, nil
}

// vaddrOf converts a file offset to a link-time address through the PT_LOAD
// segment that holds it.
func vaddrOf(progs []*elf.Prog, off uint64) (uint64, bool) {
	for _, p := range progs {
		if p.Type == elf.PT_LOAD && off >= p.Off && off-p.Off < p.Filesz {
			return off - p.Off + p.Vaddr, true
		}
	}
	return 0, false
}

// Mapping is one line of /proc/PID/maps.
type Mapping struct {
	Start, End, PgOff uint64
	Exec              bool
	Major, Minor      uint32
	Inode             uint64
	// Path is the mapped file as the process names it, "" for an
	// anonymous mapping; it may end in " (deleted)".
	Path string
}

// Parse parses the text of /proc/PID/maps, skipping lines it cannot read.
func Parse(data []byte) []Mapping {
	var out []Mapping
	for len(data) > 0 {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		if m, ok := ParseLine(line); ok {
			out = append(out, m)
		}
	}
	return out
}

// ParseLine parses "start-end perms pgoff major:minor inode [path]".
func ParseLine(line []byte) (Mapping, bool) {
	var m Mapping
	fields := bytes.Fields(line)
	if len(fields) < 5 {
		return m, false
	}
	lo, hi, ok := bytes.Cut(fields[0], []byte("-"))
	if !ok {
		return m, false
	}
	var err1, err2, err3, err4, err5, err6 error
	m.Start, err1 = strconv.ParseUint(string(lo), 16, 64)
	m.End, err2 = strconv.ParseUint(string(hi), 16, 64)
	m.Exec = len(fields[1]) >= 3 && fields[1][2] == 'x'
	m.PgOff, err3 = strconv.ParseUint(string(fields[2]), 16, 64)
	maj, mnr, ok := bytes.Cut(fields[3], []byte(":"))
	if !ok {
		return m, false
	}
	var v uint64
	v, err4 = strconv.ParseUint(string(maj), 16, 32)
	m.Major = uint32(v)
	v, err5 = strconv.ParseUint(string(mnr), 16, 32)
	m.Minor = uint32(v)
	m.Inode, err6 = strconv.ParseUint(string(fields[4]), 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil || err5 != nil || err6 != nil || m.End < m.Start {
		return Mapping{}, false
	}
	if len(fields) > 5 {
		// The path is the rest of the line after five fields; it may
		// contain spaces.
		rest := line
		for range 5 {
			// Fields split at these spaces, so five fields and a sixth
			// mean each search finds one.
			rest = bytes.TrimLeftFunc(rest, unicode.IsSpace)
			rest = rest[bytes.IndexFunc(rest, unicode.IsSpace):]
		}
		m.Path = string(bytes.TrimLeftFunc(rest, unicode.IsSpace))
	}
	return m, true
}

func sameFile(m Mapping, st os.FileInfo, real string) bool {
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && m.Inode != 0 &&
		m.Inode == sys.Ino && m.Major == unix.Major(sys.Dev) && m.Minor == unix.Minor(sys.Dev) {
		return true
	}
	// Overlay file systems may report another device in maps than stat
	// does; the path still matches.
	return real != "" && m.Path == real
}

// addrIn finds the address of file offset off in the mappings of one
// file, preferring an executable mapping.
func addrIn(ms []Mapping, off uint64) (uint64, bool) {
	found, addr := false, uint64(0)
	for _, m := range ms {
		if off < m.PgOff || off-m.PgOff >= m.End-m.Start {
			continue
		}
		if m.Exec {
			return m.Start + off - m.PgOff, true
		}
		if !found {
			found, addr = true, m.Start+off-m.PgOff
		}
	}
	return addr, found
}
