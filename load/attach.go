package load

import (
	"fmt"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/multiprobe/multiprobe/kernelprobe"
)

// UprobeAttachType returns an [Options.AttachType] hook that loads every
// uprobe program with the expected attach type of attach path p, as
// kernelprobe decided it, and leaves the others as their spec says. See
// kernelprobe.AttachType for which programs are uprobes.
//
// The attach path must be chosen before the load: a program loaded for
// uprobe_multi cannot be attached as a perf-event uprobe, nor the reverse.
func UprobeAttachType(p kernelprobe.Path) func(name string, spec *ebpf.ProgramSpec) ebpf.AttachType {
	return func(_ string, spec *ebpf.ProgramSpec) ebpf.AttachType {
		return kernelprobe.AttachType(spec, p)
	}
}

func attachName(t ebpf.AttachType) string {
	if t == ebpf.AttachNone {
		return "none"
	}
	return t.String()
}

// checkTailCallGroups returns an error wrapping ErrAttachTypeMix if programs
// that share a PROG_ARRAY would load with different expected attach types.
// A program shares the map if its instructions reference it (the caller of
// bpf_tail_call) or if the map's initial contents name it (a callee).
//
// Since Linux 6.12 the kernel records the expected attach type of a
// PROG_ARRAY's first user and rejects programs with another one, so a mix
// fails late, at the map update or the second program's load, with a bare
// EINVAL. Checking before any load names the programs instead.
func checkTailCallGroups(jobs []*job, progArrays map[string][]string) error {
	members := make(map[string][]*job) // map name -> jobs sharing it
	byName := make(map[string]*job, len(jobs))
	for _, j := range jobs {
		byName[j.name] = j
	}
	add := func(m string, j *job) {
		if !slices.Contains(members[m], j) {
			members[m] = append(members[m], j)
		}
	}
	for _, j := range jobs {
		for _, ins := range j.orig.Instructions {
			if !ins.IsLoadFromMap() {
				continue
			}
			if _, ok := progArrays[ins.Reference()]; ok {
				add(ins.Reference(), j)
			}
		}
	}
	names := make([]string, 0, len(progArrays))
	for m, callees := range progArrays {
		names = append(names, m)
		for _, c := range callees {
			if j := byName[c]; j != nil {
				add(m, j)
			}
		}
	}
	slices.Sort(names)
	for _, m := range names {
		group := members[m]
		slices.SortFunc(group, func(a, b *job) int { return a.index - b.index })
		for _, j := range group[1:] {
			if j.attach != group[0].attach {
				return fmt.Errorf("tail-call map %s: program %s loads as %s but program %s as %s: %w (kernels since 6.12 reject a mix; give the programs one attach path)",
					m, group[0].name, attachName(group[0].attach), j.name, attachName(j.attach), ErrAttachTypeMix)
			}
		}
	}
	return nil
}
