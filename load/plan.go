package load

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
)

// A plan is everything decided before the first load: the jobs, the maps
// to create, which copy of a split tail-call map each program uses, and the
// start order. Making it reads no kernel state, so that every object ends
// the same way whatever the schedule, and so that it can be fuzzed without
// BPF.
type plan struct {
	jobs  []*job // in job order
	order []*job // in start order

	// maps are the map specs to create for a Collection: the spec's, with
	// the copies of split tail-call maps added and the contents of split
	// maps divided among their copies. nil for Programs.
	maps map[string]*ebpf.MapSpec

	// copies describes every tail-call map the plan split, per copy.
	copies []MapCopy

	// skipped names a Collection's programs of unspecified type.
	skipped []string
}

// planInput is what a plan is made from.
type planInput struct {
	names []string // job names, in job order
	specs []*ebpf.ProgramSpec

	// maps are a Collection's map specs (nil for Programs).
	maps map[string]*ebpf.MapSpec
	// fixed names tail-call maps the loader must not split: the caller's
	// maps given to Programs, and a Collection's MapReplacements.
	fixed map[string]bool

	// attachTypeMatters is set for kernels that require one expected
	// attach type per PROG_ARRAY (Linux 6.12 and later).
	attachTypeMatters bool
}

// kind is what the kernel requires programs sharing a PROG_ARRAY to agree
// on: the program type and, since Linux 6.12, the expected attach type.
type kind struct {
	typ    ebpf.ProgramType
	attach ebpf.AttachType
}

func (k kind) String() string {
	s := k.typ.String()
	if k.attach != ebpf.AttachNone {
		s += "/" + k.attach.String()
	}
	return s
}

// suffix names a map copy for programs of kind k: lower case, no spaces.
func (k kind) suffix() string {
	s := strings.ToLower(k.typ.String())
	if k.attach != ebpf.AttachNone {
		s += "_" + strings.ToLower(k.attach.String())
	}
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' {
			return r
		}
		return '_'
	}, s)
}

// TailCallGroup is one kind of program among those sharing a tail-call map.
type TailCallGroup struct {
	// Type and AttachType are what the group's programs load with.
	Type       ebpf.ProgramType
	AttachType ebpf.AttachType
	// Programs are the group's programs, in job order: those that call
	// through the map and those the map's contents name.
	Programs []string
}

func (g TailCallGroup) kind() kind { return kind{g.Type, g.AttachType} }

// TailCallMixError is returned, before anything is created, when programs
// of different types (or, on Linux 6.12 and later, different expected
// attach types) share one tail-call map (PROG_ARRAY). The kernel gives a
// PROG_ARRAY the type of the first program that uses it and rejects the
// others after their verification, so which group fails would depend on
// which loaded first. It wraps [ErrTailCallMix].
type TailCallMixError struct {
	// Map is the tail-call map's name.
	Map string
	// Groups are the kinds of program sharing it, in order of their first
	// program.
	Groups []TailCallGroup
	// Reason, if set, is why Options.SplitTailCallMaps could not split it.
	Reason string
	// attachTypes tells whether the kernel requires one attach type.
	attachTypes bool
}

// Error names the map, every group and the fix.
func (e *TailCallMixError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "tail-call map %s is shared by", e.Map)
	for i, g := range e.Groups {
		switch {
		case i == 0:
		case i == len(e.Groups)-1:
			b.WriteString(" and")
		default:
			b.WriteString(",")
		}
		fmt.Fprintf(&b, " %s programs (%s)", g.kind(), strings.Join(g.Programs, ", "))
	}
	what := "program type"
	if e.attachTypes {
		what = "program type and expected attach type (Linux 6.12, and stable kernels with the fix)"
	}
	fmt.Fprintf(&b, ": %v; the kernel gives a PROG_ARRAY the %s of its first user and rejects the others after verification, so which group failed would depend on load timing", ErrTailCallMix, what)
	if e.Reason != "" {
		fmt.Fprintf(&b, "; the map cannot be split: %s", e.Reason)
		fmt.Fprintf(&b, "; fix: give each group its own tail-call map in the BPF source")
		return b.String()
	}
	fmt.Fprintf(&b, "; fix: give each group its own tail-call map in the BPF source, or set load.Options.SplitTailCallMaps to load a copy of %s per group", e.Map)
	return b.String()
}

// Unwrap returns [ErrTailCallMix].
func (e *TailCallMixError) Unwrap() error { return ErrTailCallMix }

// MapCopy is one copy of a tail-call map that [Options.SplitTailCallMaps]
// split: the map the programs of one kind use.
type MapCopy struct {
	// Map is the name of the map in the spec.
	Map string `json:"map"`
	// Copy is the name of the copy in the Collection's Maps. The group of
	// the first program keeps the map's own name.
	Copy string `json:"copy"`
	// Type and AttachType are the program type and expected attach type of
	// the programs using the copy ("none" for none).
	Type       string `json:"type"`
	AttachType string `json:"attach_type"`
	// Programs use the copy, in job order: their references to Map were
	// rewritten to Copy, and Copy's contents are the entries of Map that
	// name them.
	Programs []string `json:"programs"`
}

func attachName(t ebpf.AttachType) string {
	if t == ebpf.AttachNone {
		return "none"
	}
	return t.String()
}

// makePlan decides the jobs and their order. It fails, before anything is
// created, if programs of different kinds share a tail-call map and the
// map cannot or may not be split.
func makePlan(in planInput, o *Options) (*plan, error) {
	p := &plan{jobs: make([]*job, len(in.specs))}
	byName := make(map[string]*job, len(in.specs))
	for i, ps := range in.specs {
		at := ps.AttachType
		if o.AttachType != nil {
			at = o.AttachType(in.names[i], ps)
		}
		j := &job{index: i, name: in.names[i], orig: ps, attach: at}
		p.jobs[i] = j
		byName[j.name] = j
	}
	if in.maps != nil {
		p.maps = maps.Clone(in.maps)
	}

	arrays := map[string]bool{}
	for name, ms := range in.maps {
		if ms != nil && ms.Type == ebpf.ProgramArray {
			arrays[name] = true
		}
	}
	for name := range in.fixed {
		arrays[name] = true
	}
	for _, m := range slices.Sorted(maps.Keys(arrays)) {
		if err := p.checkTailCallMap(m, in, o, byName); err != nil {
			return nil, err
		}
	}

	switch o.Order {
	case OrderCached:
		cachedCosts(o.Costs, p.jobs)
	default:
		for _, j := range p.jobs {
			j.cost = float64(len(j.orig.Instructions))
		}
	}
	p.order = slices.Clone(p.jobs)
	if o.Order != OrderGiven {
		// Stable: equal costs keep job order, so runs are reproducible.
		slices.SortStableFunc(p.order, func(a, b *job) int { return cmp.Compare(b.cost, a.cost) })
	}
	return p, nil
}

// checkTailCallMap groups the programs sharing tail-call map m by kind and,
// if there is more than one kind, splits m or fails.
//
// A program shares m if its instructions load m (the caller of
// bpf_tail_call) or if m's initial contents name it (a callee).
func (p *plan) checkTailCallMap(m string, in planInput, o *Options, byName map[string]*job) error {
	var members []*job
	for _, j := range p.jobs {
		if references(j.orig, m) {
			members = append(members, j)
		}
	}
	ms := in.maps[m]
	if ms != nil {
		for _, kv := range ms.Contents {
			if s, ok := kv.Value.(string); ok {
				if j := byName[s]; j != nil && !slices.Contains(members, j) {
					members = append(members, j)
				}
			}
		}
	}
	if len(members) == 0 {
		return nil // an unused map: nothing to agree on
	}
	slices.SortFunc(members, func(a, b *job) int { return a.index - b.index })

	kindOf := func(j *job) kind {
		k := kind{typ: j.orig.Type, attach: j.attach}
		if !in.attachTypeMatters {
			k.attach = ebpf.AttachNone
		}
		return k
	}
	var groups []TailCallGroup
	groupOf := map[kind]int{}
	for _, j := range members {
		k := kindOf(j)
		g, ok := groupOf[k]
		if !ok {
			g = len(groups)
			groupOf[k] = g
			groups = append(groups, TailCallGroup{Type: k.typ, AttachType: k.attach})
		}
		groups[g].Programs = append(groups[g].Programs, j.name)
	}
	if len(groups) == 1 {
		return nil
	}

	mixErr := &TailCallMixError{Map: m, Groups: groups, attachTypes: in.attachTypeMatters}
	switch {
	case !o.SplitTailCallMaps:
		return mixErr
	case in.fixed[m] || ms == nil:
		mixErr.Reason = "it is the caller's map (given to Programs or in MapReplacements), not the loader's"
		return mixErr
	}
	// A group whose programs only sit in the map's contents, with none of
	// them calling through it, would get a copy nobody calls: the tail
	// calls of the other groups into those slots would silently miss.
	for _, g := range groups {
		if !slices.ContainsFunc(g.Programs, func(n string) bool { return references(byName[n].orig, m) }) {
			mixErr.Reason = fmt.Sprintf("no %s program calls through it, so a copy for %s would be unreachable", g.kind(), strings.Join(g.Programs, ", "))
			return mixErr
		}
	}

	names := make([]string, len(groups))
	copies := make([]*ebpf.MapSpec, len(groups))
	for gi, g := range groups {
		names[gi] = m
		if gi > 0 {
			names[gi] = p.freeName(m + "_" + g.kind().suffix())
		}
		c := ms.Copy()
		c.Contents = nil
		if gi > 0 {
			// The kernel's name is at most 15 bytes; cilium truncates it.
			c.Name = names[gi]
		}
		copies[gi] = c
		p.maps[names[gi]] = c
	}
	for _, kv := range ms.Contents {
		gi := 0 // fds, programs and unknown names stay with the first group
		if s, ok := kv.Value.(string); ok {
			if j := byName[s]; j != nil {
				gi = groupOf[kindOf(j)]
			}
		}
		copies[gi].Contents = append(copies[gi].Contents, kv)
	}
	for gi, g := range groups {
		for _, n := range g.Programs {
			if gi > 0 {
				j := byName[n]
				if j.rename == nil {
					j.rename = map[string]string{}
				}
				j.rename[m] = names[gi]
			}
		}
		p.copies = append(p.copies, MapCopy{
			Map: m, Copy: names[gi],
			Type: g.Type.String(), AttachType: attachName(g.AttachType),
			Programs: slices.Clone(g.Programs),
		})
	}
	return nil
}

// freeName returns name, or name with a number appended, whichever no map
// of the plan has.
func (p *plan) freeName(name string) string {
	if _, taken := p.maps[name]; !taken {
		return name
	}
	for i := 2; ; i++ {
		n := name + strconv.Itoa(i)
		if _, taken := p.maps[n]; !taken {
			return n
		}
	}
}

// references reports whether spec's instructions load map m.
func references(spec *ebpf.ProgramSpec, m string) bool {
	for i := range spec.Instructions {
		ins := &spec.Instructions[i]
		if ins.IsLoadFromMap() && ins.Reference() == m {
			return true
		}
	}
	return false
}

// cachedCosts estimates each job's verification time in nanoseconds: the
// measured time for programs the cache knows, the instruction count times
// the kernel's rate per processed instruction for the others.
func cachedCosts(c *CostCache, jobs []*job) {
	var ns, insns float64
	costs := make([]Cost, len(jobs))
	for i, j := range jobs {
		cost, ok := c.lookup(j.orig, j.attach)
		if !ok {
			continue
		}
		costs[i], j.cached = cost, true
		if cost.Verified > 0 {
			ns += float64(cost.Verify)
			insns += float64(cost.Verified)
		}
	}
	rate := float64(defaultNsPerInsn)
	if insns > 0 {
		rate = ns / insns
	}
	for i, j := range jobs {
		if j.cached {
			j.cost = float64(costs[i].Verify)
		} else {
			j.cost = float64(len(j.orig.Instructions)) * rate
		}
	}
}
