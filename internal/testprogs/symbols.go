package testprogs

import (
	"debug/elf"
	"fmt"
)

// SymbolOffsets returns the file offset of every defined function symbol in
// the ELF file at path, by name, converting each address through the
// PT_LOAD segment that contains it. It is deliberately simple and separate
// from package elfsym, so that tests can check one against the other.
func SymbolOffsets(path string) (map[string]uint64, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("testprogs: %w", err)
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		return nil, fmt.Errorf("testprogs: symbols of %s: %w", path, err)
	}
	out := make(map[string]uint64, len(syms))
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) != elf.STT_FUNC || s.Section == elf.SHN_UNDEF || s.Value == 0 {
			continue
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_LOAD && s.Value >= p.Vaddr && s.Value < p.Vaddr+p.Memsz {
				out[s.Name] = s.Value - p.Vaddr + p.Off
				break
			}
		}
	}
	return out, nil
}

// TargetOffsets returns the file offsets of func_00000 … func_{n-1} in a
// target built by [Target] with n functions.
func TargetOffsets(path string, n int) ([]uint64, error) {
	all, err := SymbolOffsets(path)
	if err != nil {
		return nil, err
	}
	out := make([]uint64, n)
	for i := range out {
		off, ok := all[FuncName(i)]
		if !ok {
			return nil, fmt.Errorf("testprogs: %s has no function %s", path, FuncName(i))
		}
		out[i] = off
	}
	return out, nil
}
