package ifunc

import (
	"debug/elf"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/multiprobe/multiprobe/elfsym"
	"github.com/multiprobe/multiprobe/internal/fds"
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
// library open as f (named by f.Name()): an IFUNC site's implementation on
// this machine (see Resolve and Entry; for a library in another process's
// root, /proc/PID/root/..., the one process PID's loader chose, see
// ResolveIn), any other site's Offset; and, per site, what was done, in
// the terms of elfsym.Site.Moved (a site that is not an IFUNC keeps its
// own). It reads f, the very file the sites were resolved in, and no
// other that its name may lead to since. Where an implementation cannot
// be found, the resolver stays and Moved says why: a probe that attaches
// fewer functions than it named would be worse than one that says what it
// probes.
func Sites(f *os.File, sites []elfsym.Site) (offsets []uint64, moved []string) {
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
	path := f.Name()
	ef, err := elf.NewFile(f)
	if err != nil {
		for _, i := range idx {
			moved[i] = fmt.Sprintf("%s (IFUNC resolver kept: ifunc: %s: %v)", NotMoved, path, err)
		}
		return offsets, moved
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
			moved[i] = fmt.Sprintf("%s (IFUNC resolver kept: %v)", NotMoved, why)
			continue
		}
		moved[i] = fmt.Sprintf("%s (resolver at %#x)", Moved, sites[i].Offset)
		buf := make([]byte, EntryWindow)
		n, _ := f.ReadAt(buf, int64(off))
		if skip, why := Entry(ef.Machine, buf[:n]); skip > 0 {
			off += uint64(skip)
			moved[i] += ", " + why
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
