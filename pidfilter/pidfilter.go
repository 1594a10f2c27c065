package pidfilter

import (
	"errors"
	"fmt"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/multiprobe/multiprobe/internal/prologue"
)

// MapName is the name of the pid set map: a BPF hash from a process id (the
// tgid, u32) to its reference count (u32, see [Filter]).
// bpf/mp_pids.bpf.h declares it, and AllMapName's map, for programs that
// want them in their generated objects.
const MapName = "mp_pids"

// AllMapName is the name of the map that lets every process through: a
// BPF array of one u32, the number of holders of [AllPIDs]. The prologue
// reads it first; an array lookup is inlined by the verifier, so a filter
// that admits every process costs no helper call and no hash lookup.
const AllMapName = "mp_pids_all"

// DefaultMaxPIDs is the capacity of the pid set map that Inject adds. Change
// cs.Maps[MapName].MaxEntries after Inject for another one.
const DefaultMaxPIDs = 1024

var (
	// ErrNoProgram: Inject was asked for a program the spec does not have,
	// or one that cannot take the filter.
	ErrNoProgram = errors.New("no such program to filter")
	// ErrBadMap: the spec or the collection already has a map named MapName
	// or AllMapName, but not of the type and sizes the filter needs.
	ErrBadMap = errors.New("map " + MapName + " is not a hash of u32 pid to u32 count, or " + AllMapName + " not an array of one u32")
)

// MapSpec returns the spec of the pid set map with room for maxPIDs pids.
func MapSpec(maxPIDs uint32) *ebpf.MapSpec {
	return &ebpf.MapSpec{
		Name:       MapName,
		Type:       ebpf.Hash,
		KeySize:    4,
		ValueSize:  4,
		MaxEntries: maxPIDs,
	}
}

// AllMapSpec returns the spec of the every-process map.
func AllMapSpec() *ebpf.MapSpec {
	return &ebpf.MapSpec{
		Name:       AllMapName,
		Type:       ebpf.Array,
		KeySize:    4,
		ValueSize:  4,
		MaxEntries: 1,
	}
}

// stackSlot is where the prologue stores the lookup keys. It is below the
// frame pointer like every stack slot; the program overwrites it freely
// afterwards.
const stackSlot = -4

// filter returns the instructions that end the program with 0 unless
// every process is let through (AllMapName) or the current process is in
// the set (MapName), and otherwise leave r1 = ctx as the program expects
// it. r6 is callee-saved, so it survives the helper calls; the program's
// own code starts with only r1 and r10 defined, so using r6 here takes
// nothing from it.
//
// The filter reads the every-process count and then looks the pid up:
// two reads, between which the set may change. Filter keeps a pid that
// its holders release while every process is let through until that ends
// (see Filter.purge), so that a process let through all along is found.
func filter() asm.Instructions {
	const (
		program = prologue.Label("program") // past the filter: r1 = r6, the program
		drop    = prologue.Label("drop")
	)
	j := func(ins asm.Instruction, to prologue.Label) prologue.Jump {
		return prologue.Jump{Instruction: ins, To: to}
	}
	return prologue.Resolve(
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.StoreImm(asm.RFP, stackSlot, 0, asm.Word),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, stackSlot),
		asm.LoadMapPtr(asm.R1, 0).WithReference(AllMapName),
		asm.FnMapLookupElem.Call(),
		j(asm.JEq.Imm(asm.R0, 0, ""), drop),
		asm.LoadMem(asm.R1, asm.R0, 0, asm.Word),
		j(asm.JNE.Imm(asm.R1, 0, ""), program),
		asm.FnGetCurrentPidTgid.Call(),
		asm.RSh.Imm(asm.R0, 32), // the tgid: what user space calls the pid
		asm.StoreMem(asm.RFP, stackSlot, asm.R0, asm.Word),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, stackSlot),
		asm.LoadMapPtr(asm.R1, 0).WithReference(MapName),
		asm.FnMapLookupElem.Call(),
		j(asm.JNE.Imm(asm.R0, 0, ""), program),
		drop,
		asm.Mov.Imm(asm.R0, 0),
		asm.Return(),
	)
}

// Inject prepends a pid filter to the named programs of cs, or to every
// kprobe-type program (uprobes included) if no name is given, and adds the
// pid set map (MapName, DefaultMaxPIDs entries) and the every-process map
// (AllMapName) to cs unless it already has fitting ones. A filtered program returns 0 at once for every process
// whose pid (tgid) is not in the set, and otherwise runs unchanged: the
// context register is restored and the program's BTF function and line
// information move with its entry point, so bpf-to-bpf calls, global
// functions and tail calls verify as before. Programs reached only by
// tail calls need no filter: their caller already passed it.
//
// The set starts empty, so a filtered program does nothing until pids (or
// AllPIDs) are acquired; see [Filter]. Inject is idempotent: a program already filtered is
// left alone.
func Inject(cs *ebpf.CollectionSpec, programs ...string) error {
	if cs == nil {
		return fmt.Errorf("pidfilter: nil collection spec: %w", ErrNoProgram)
	}
	for _, want := range []*ebpf.MapSpec{MapSpec(0), AllMapSpec()} {
		if m, ok := cs.Maps[want.Name]; ok && !fitsSpec(m, want) {
			return fmt.Errorf("pidfilter: collection's map %s is %v with key/value size %d/%d: %w", want.Name, m.Type, m.KeySize, m.ValueSize, ErrBadMap)
		}
	}
	var specs []*ebpf.ProgramSpec
	if len(programs) == 0 {
		for _, name := range sortedKeys(cs.Programs) {
			if p := cs.Programs[name]; p.Type == ebpf.Kprobe {
				specs = append(specs, p)
			}
		}
		if len(specs) == 0 {
			return fmt.Errorf("pidfilter: collection has no kprobe or uprobe programs: %w", ErrNoProgram)
		}
	}
	for _, name := range programs {
		p, ok := cs.Programs[name]
		if !ok {
			return fmt.Errorf("pidfilter: collection has no program %q (it has %v): %w", name, sortedKeys(cs.Programs), ErrNoProgram)
		}
		specs = append(specs, p)
	}
	for _, p := range specs {
		if err := InjectProgram(p); err != nil {
			return err
		}
	}
	if _, ok := cs.Maps[MapName]; !ok {
		cs.Maps[MapName] = MapSpec(DefaultMaxPIDs)
	}
	if _, ok := cs.Maps[AllMapName]; !ok {
		cs.Maps[AllMapName] = AllMapSpec()
	}
	return nil
}

// InjectProgram prepends the pid filter to one program spec. The filter
// refers to its maps by the names MapName and AllMapName: load the program
// as part of a collection that has them (see MapSpec and AllMapSpec), or
// point it at loaded maps (those of a [Filter] from [NewFilter]) with
// p.Instructions.AssociateMap before ebpf.NewProgram.
func InjectProgram(p *ebpf.ProgramSpec) error {
	if p == nil || len(p.Instructions) == 0 {
		return fmt.Errorf("pidfilter: empty program: %w", ErrNoProgram)
	}
	switch p.Type {
	case ebpf.Kprobe, ebpf.TracePoint, ebpf.PerfEvent, ebpf.RawTracepoint, ebpf.Tracing:
		// bpf_get_current_pid_tgid is available to these.
	default:
		return fmt.Errorf("pidfilter: program %s has type %v, which runs outside any process context; filter tracing programs only: %w", p.Name, p.Type, ErrNoProgram)
	}
	if injected(p.Instructions) {
		return nil
	}
	prologue.Prepend(p, append(filter(), asm.Mov.Reg(asm.R1, asm.R6)))
	return nil
}

// injected reports whether insns start with the prologue.
func injected(insns asm.Instructions) bool {
	want := filter()
	if len(insns) <= len(want) {
		return false
	}
	for i, ins := range want {
		got := insns[i]
		if got.OpCode != ins.OpCode || got.Dst != ins.Dst || got.Src != ins.Src || got.Reference() != ins.Reference() {
			return false
		}
	}
	return true
}

// fitsSpec reports whether m can serve as the map want describes.
func fitsSpec(m, want *ebpf.MapSpec) bool {
	if want.Type == ebpf.Array {
		return m.Type == ebpf.Array && m.KeySize == 4 && m.ValueSize == 4 && m.MaxEntries >= 1
	}
	return (m.Type == ebpf.Hash || m.Type == ebpf.LRUHash) && m.KeySize == 4 && m.ValueSize == 4
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
