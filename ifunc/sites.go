package ifunc

import (
	"debug/elf"
	"fmt"
	"os"

	"github.com/multiprobe/multiprobe/elfsym"
)

// What Sites says of an IFUNC site, in its Moved.
const (
	// Moved starts Moved for an IFUNC site probed at the implementation
	// this machine's loader selects; the resolver's offset follows.
	Moved = "the IFUNC's implementation on this machine"
	// NotMoved starts Moved for an IFUNC site whose implementation could
	// not be found: the site is its resolver, which runs once per
	// process; why follows.
	NotMoved = "not moved"
)

// Sites returns where to probe each of sites, resolved in the shared
// library at path: an IFUNC site's implementation on this machine (see
// Resolve and Entry), any other site's Offset; and, per site, what was
// done, in the terms of elfsym.Site.Moved (a site that is not an IFUNC
// keeps its own). Where an implementation cannot be found, the resolver
// stays and Moved says why: a probe that attaches fewer functions than
// it named would be worse than one that says what it probes.
func Sites(path string, sites []elfsym.Site) (offsets []uint64, moved []string) {
	offsets, moved = make([]uint64, len(sites)), make([]string, len(sites))
	var idx []int
	var resolvers []uint64
	for i, s := range sites {
		offsets[i], moved[i] = s.Offset, s.Moved
		if s.Type == elf.STT_GNU_IFUNC {
			idx = append(idx, i)
			resolvers = append(resolvers, s.Address)
		}
	}
	if len(idx) == 0 {
		return offsets, moved
	}
	ef, err := elf.Open(path)
	if err != nil {
		for _, i := range idx {
			moved[i] = fmt.Sprintf("%s (IFUNC resolver kept: %v)", NotMoved, err)
		}
		return offsets, moved
	}
	defer ef.Close()
	impls, whys, err := resolve(path, ef, resolvers)
	code, _ := os.Open(path) // for where on an implementation to probe
	if code != nil {
		defer code.Close()
	}
	for j, i := range idx {
		off, ok := uint64(0), impls != nil && impls[j] != 0
		if ok {
			off, ok = fileOffset(ef, impls[j])
		}
		if !ok {
			why := err
			switch {
			case why != nil:
			case whys[j] != nil:
				why = whys[j]
			default:
				why = fmt.Errorf("implementation %#x is in no executable segment", impls[j])
			}
			moved[i] = fmt.Sprintf("%s (IFUNC resolver kept: %v)", NotMoved, why)
			continue
		}
		moved[i] = fmt.Sprintf("%s (resolver at %#x)", Moved, sites[i].Offset)
		if code != nil {
			buf := make([]byte, EntryWindow)
			n, _ := code.ReadAt(buf, int64(off))
			if skip, why := Entry(ef.Machine, buf[:n]); skip > 0 {
				off += uint64(skip)
				moved[i] += ", " + why
			}
		}
		offsets[i] = off
	}
	return offsets, moved
}

// fileOffset converts a virtual address inside an executable PT_LOAD
// segment into a file offset.
func fileOffset(ef *elf.File, vaddr uint64) (uint64, bool) {
	for _, p := range ef.Progs {
		if p.Type == elf.PT_LOAD && p.Flags&elf.PF_X != 0 && vaddr >= p.Vaddr && vaddr-p.Vaddr < p.Filesz {
			return vaddr - p.Vaddr + p.Off, true
		}
	}
	return 0, false
}
