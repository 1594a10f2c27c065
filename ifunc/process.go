package ifunc

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	"github.com/multiprobe/multiprobe/internal/fds"
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
// resolver. A resolver without one (glibc 2.36 has 12 of 47, time and
// strstr among them, that it never calls itself) gets 0, and an error says
// so, joined with the others.
func ResolveIn(pid int, path string, resolvers []uint64) ([]uint64, error) {
	out, whys, err := resolveIn(pid, path, resolvers)
	if err != nil {
		return nil, err
	}
	return out, errors.Join(whys...)
}

// resolveIn is ResolveIn with a reason per resolver, as resolve.
func resolveIn(pid int, path string, resolvers []uint64) (out []uint64, whys []error, err error) {
	// Confined to the process's root if path is in it, as every file
	// multiprobe reads (fds.OpenRegular).
	f, err := fds.OpenRegular(path)
	if err != nil {
		return nil, nil, fmt.Errorf("ifunc: %w", err)
	}
	defer f.Close()
	id, err := mapsID(f)
	if err != nil {
		return nil, nil, fmt.Errorf("ifunc: %s: %w", path, err)
	}
	ef, err := elf.NewFile(f)
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
	for i, r := range resolvers {
		slot, ok := slots[r]
		if !ok {
			whys[i] = fmt.Errorf("ifunc: %s: no IRELATIVE relocation records what process %d's loader chose for the resolver at %#x", path, pid, r)
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
