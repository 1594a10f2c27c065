package ifunc

import (
	"debug/elf"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/multiprobe/multiprobe/elfsym"
	"github.com/multiprobe/multiprobe/internal/fds"
)

// Sites returns a copy of sites, resolved in the shared library open as f
// (named by f.Name()), with each IFUNC site at the implementation this
// machine's loader selects (elfsym.MovedIFunc; see Resolve and Entry; for
// a library in another process's root, /proc/PID/root/..., the one
// process PID's loader chose, see ResolveIn), and the others as they
// were. It reads f, the very file the sites were resolved in, and no
// other that its name may lead to since. Where an implementation cannot
// be found, the site keeps its resolver (elfsym.KeptIFuncResolver) and its
// Note says why: a probe that attaches fewer functions than it named would
// be worse than one that says what it probes.
func Sites(f *os.File, sites []elfsym.Site) []elfsym.Site {
	out := slices.Clone(sites)
	var idx []int
	var resolvers []uint64
	for i, s := range sites {
		if s.Type == elf.STT_GNU_IFUNC {
			idx = append(idx, i)
			resolvers = append(resolvers, s.Address)
		}
	}
	if len(idx) == 0 {
		return out
	}
	keep := func(i int, why string) {
		out[i].Moved, out[i].Note = elfsym.KeptIFuncResolver, why
	}
	path := f.Name()
	ef, err := elf.NewFile(f)
	if err != nil {
		for _, i := range idx {
			keep(i, fmt.Sprintf("ifunc: %s: %v", path, err))
		}
		return out
	}
	var impls []uint64
	var whys []error
	if root, _, ok := fds.SplitProcRoot(path); ok && root != "/proc/self/root" {
		// Another process's root: a container's library, whose code
		// runs in the container and nowhere else. Its process has
		// loaded it, or will not run it.
		pid, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(root, "/proc/"), "/root"))
		impls, whys, err = resolveIn(pid, f, ef, resolvers)
	} else {
		impls, whys, err = resolve(path, f, ef, resolvers)
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
			keep(i, why.Error())
			continue
		}
		note := fmt.Sprintf("resolver at %#x", sites[i].Offset)
		buf := make([]byte, EntryWindow)
		n, _ := f.ReadAt(buf, int64(off))
		if skip, why := Entry(ef.Machine, buf[:n]); skip > 0 {
			off += uint64(skip)
			note += ", " + why
		}
		out[i].Offset, out[i].Moved, out[i].Note = off, elfsym.MovedIFunc, note
	}
	return out
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
