package ifunc

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ResolveIn is Resolve for the copy of the shared library at path that
// process pid has loaded: it reads what that process's loader chose from
// the process's memory, and runs no code at all. It is what Sites does for
// a library inside another process's root (/proc/PID/root/...): a
// container's library is the container's code, which must not run in a
// process of the host's, and its loader and CPU tunables are its own.
//
// The loader writes each implementation it chooses for the library's own
// calls into the GOT slot of an IRELATIVE relocation whose addend is the
// resolver. For an IFUNC the library never calls itself (glibc 2.36 on
// x86-64 has 12 of 47, time and strstr among them) it reads the GOT slots
// the process's other objects have for its name, once bound. A resolver
// found in neither gets 0, and an error says so, joined with the others.
func ResolveIn(pid int, path string, resolvers []uint64) ([]uint64, error) {
	return onLibrary(path, func(f *os.File, ef *elf.File) ([]uint64, []error, error) {
		return resolveIn(pid, f, ef, resolvers)
	})
}

// resolveIn is ResolveIn for the library open as f and read as ef, with a
// reason per resolver, as resolve.
func resolveIn(pid int, f *os.File, ef *elf.File, resolvers []uint64) (out []uint64, whys []error, err error) {
	path := f.Name()
	id, err := mapsID(f)
	if err != nil {
		return nil, nil, fmt.Errorf("ifunc: %s: %w", path, err)
	}
	slots, err := irelativeSlots(ef)
	if err != nil {
		return nil, nil, fmt.Errorf("ifunc: %s: %w", path, err)
	}
	bias, lo, hi, err := loadBias(pid, id, ef)
	if errors.Is(err, errNotMapped) {
		return nil, nil, fmt.Errorf("ifunc: %s: process %d does not map it", path, pid)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("ifunc: %s in process %d: %w", path, pid, err)
	}
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		return nil, nil, fmt.Errorf("ifunc: %w", err)
	}
	defer mem.Close()
	out, whys = make([]uint64, len(resolvers)), make([]error, len(resolvers))
	// The library does not call every IFUNC of its own (glibc 2.36 on
	// x86-64 has no IRELATIVE slot for 12 of its 47, strstr and time
	// among them; arm64's for memcpy): their implementations are in the
	// GOTs of the objects that call them, once bound.
	unslotted := map[uint64]int{} // resolver -> index
	for i, r := range resolvers {
		if _, ok := slots[r]; !ok {
			unslotted[r] = i
			whys[i] = fmt.Errorf("ifunc: %s: no IRELATIVE relocation of the library, and no GOT slot of another object of process %d, records what its loader chose for the resolver at %#x (a lazy PLT slot is bound at the first call)", path, pid, r)
		}
	}
	if len(unslotted) > 0 {
		for i, got := range boundElsewhere(pid, lo, hi, mem, ifuncNames(ef, unslotted)) {
			out[i], whys[i] = got-bias, nil
		}
	}
	for i, r := range resolvers {
		slot, ok := slots[r]
		if !ok {
			continue
		}
		var b [8]byte
		if _, err := mem.ReadAt(b[:], int64(bias+slot)); err != nil {
			return nil, nil, fmt.Errorf("ifunc: %s: reading process %d's GOT slot %#x: %w", path, pid, slot, err)
		}
		switch got := binary.LittleEndian.Uint64(b[:]); {
		case got < lo || got >= hi:
			whys[i] = fmt.Errorf("ifunc: %s: process %d's loader chose %#x for the resolver at %#x, in %s, not in the library", path, pid, got, r, mappingAt(pid, got))
		default:
			out[i] = got - bias
		}
	}
	return out, whys, nil
}

// irelativeSlots maps each resolver that an IRELATIVE relocation of ef
// names (its addend) to the relocation's GOT slot, both virtual addresses
// of the file.
func irelativeSlots(ef *elf.File) (map[uint64]uint64, error) {
	var irelative uint32
	switch ef.Machine {
	case elf.EM_X86_64:
		irelative = uint32(elf.R_X86_64_IRELATIVE)
	case elf.EM_AARCH64:
		irelative = uint32(elf.R_AARCH64_IRELATIVE)
	default:
		return nil, fmt.Errorf("%w: %s relocations", ErrUnsupported, ef.Machine)
	}
	if ef.Class != elf.ELFCLASS64 || ef.Data != elf.ELFDATA2LSB {
		return nil, fmt.Errorf("%w: not a 64-bit little-endian file", ErrUnsupported)
	}
	slots := map[uint64]uint64{}
	for _, s := range ef.Sections {
		if s.Type != elf.SHT_RELA {
			continue
		}
		data, err := s.Data()
		if err != nil {
			return nil, fmt.Errorf("section %s: %w", s.Name, err)
		}
		const relaSize = 24 // Elf64_Rela: offset, info, addend
		for ; len(data) >= relaSize; data = data[relaSize:] {
			if uint32(binary.LittleEndian.Uint64(data[8:])) == irelative {
				slots[binary.LittleEndian.Uint64(data[16:])] = binary.LittleEndian.Uint64(data[0:])
			}
		}
	}
	return slots, nil
}

// ifuncNames maps the names (without their version) of ef's IFUNC symbols
// whose resolver index holds to that resolver's index.
func ifuncNames(ef *elf.File, index map[uint64]int) map[string]int {
	names := map[string]int{}
	syms, _ := ef.DynamicSymbols()
	for _, sym := range syms {
		if elf.ST_TYPE(sym.Info) != elf.STT_GNU_IFUNC {
			continue
		}
		if i, ok := index[sym.Value]; ok {
			names[sym.Name] = i
		}
	}
	return names
}

// boundElsewhere reads, for each symbol of names, the GOT slots that the
// objects process pid maps (the library among them) have for it: their
// GLOB_DAT, JUMP_SLOT and absolute relocations naming it. It returns, by
// names' index, the first value in the library's range [lo, hi): a bound
// slot of an IFUNC holds the implementation; an unbound lazy one holds an
// address in its own object's PLT, and a non-PIE executable's canonical
// PLT entry is in the executable. The objects are read through
// /proc/PID/map_files, which opens the very file mapped, whatever root it
// is in; those that cannot be read are passed over.
func boundElsewhere(pid int, lo, hi uint64, mem *os.File, names map[string]int) map[int]uint64 {
	found := map[int]uint64{}
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return found
	}
	seen := map[fileID]bool{}
	for _, line := range strings.Split(string(maps), "\n") {
		// start-end perms offset dev inode path
		fields := strings.Fields(line)
		if len(fields) < 6 || fields[2] != "00000000" || fields[4] == "0" {
			continue
		}
		ino, _ := strconv.ParseUint(fields[4], 10, 64)
		id := fileID{dev: fields[3], ino: ino}
		if seen[id] {
			continue
		}
		seen[id] = true
		start, _, _ := strings.Cut(fields[0], "-")
		base, _ := strconv.ParseUint(start, 16, 64)
		f, err := os.Open(fmt.Sprintf("/proc/%d/map_files/%s", pid, fields[0]))
		if err != nil {
			continue
		}
		gotSlots(f, base, lo, hi, mem, names, found)
		f.Close()
		if len(found) == len(names) {
			break
		}
	}
	return found
}

// gotSlots adds to found what the GOT slots of the object f, mapped from
// base on, hold for the symbols of names, where that is in [lo, hi).
func gotSlots(f *os.File, base, lo, hi uint64, mem *os.File, names map[string]int, found map[int]uint64) {
	ef, err := elf.NewFile(f)
	if err != nil || ef.Class != elf.ELFCLASS64 || ef.Data != elf.ELFDATA2LSB {
		return
	}
	var kinds [3]uint32 // the relocations that store a symbol's address
	switch ef.Machine {
	case elf.EM_X86_64:
		kinds = [3]uint32{uint32(elf.R_X86_64_GLOB_DAT), uint32(elf.R_X86_64_JMP_SLOT), uint32(elf.R_X86_64_64)}
	case elf.EM_AARCH64:
		kinds = [3]uint32{uint32(elf.R_AARCH64_GLOB_DAT), uint32(elf.R_AARCH64_JUMP_SLOT), uint32(elf.R_AARCH64_ABS64)}
	default:
		return
	}
	bias := base
	for _, p := range ef.Progs {
		if p.Type == elf.PT_LOAD {
			bias -= p.Vaddr &^ (uint64(os.Getpagesize()) - 1)
			break
		}
	}
	syms, err := ef.DynamicSymbols()
	if err != nil {
		return
	}
	for _, s := range ef.Sections {
		if s.Type != elf.SHT_RELA || s.Link == 0 || int(s.Link) >= len(ef.Sections) || ef.Sections[s.Link].Type != elf.SHT_DYNSYM {
			continue
		}
		data, err := s.Data()
		if err != nil {
			continue
		}
		const relaSize = 24 // Elf64_Rela: offset, info, addend
		for ; len(data) >= relaSize; data = data[relaSize:] {
			info := binary.LittleEndian.Uint64(data[8:])
			if typ := uint32(info); typ != kinds[0] && typ != kinds[1] && typ != kinds[2] {
				continue
			}
			sym := int(info >> 32) // DynamicSymbols leaves out the null symbol 0
			if sym == 0 || sym > len(syms) {
				continue
			}
			i, ok := names[syms[sym-1].Name]
			if !ok {
				continue
			}
			if _, done := found[i]; done {
				continue
			}
			var b [8]byte
			if _, err := mem.ReadAt(b[:], int64(bias+binary.LittleEndian.Uint64(data[0:]))); err == nil {
				if v := binary.LittleEndian.Uint64(b[:]); v >= lo && v < hi {
					found[i] = v
				}
			}
		}
	}
}
