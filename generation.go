package multiprobe

import (
	"encoding/binary"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/multiprobe/multiprobe/internal/prologue"
	"github.com/multiprobe/multiprobe/usdt"
)

// Changing a Link's probe set without a gap (Link.Update).
//
// The kernel cannot change a uprobe link's sites, so an update makes the
// new links before it closes the old (make before break), and a site in
// both sets has two consumers for a while: each call runs the old
// program and the new one. Each program copy carries its generation as a
// constant, and the Link's state map holds the current generation and
// whether an update is under way (overlap). Outside an update a copy runs
// its program unless its generation is newer than the current one: one
// array read per call.
//
// During an update the two runs of one call must count it once, whenever
// the switch of the current generation falls. The kernel runs a uprobe's
// consumers newest first (consumer_add puts a consumer at the head of the
// list, in every kernel from 5.10 to 6.18), so at a site in both sets the
// new copy runs first and tells the old one, through a slot per thread
// (the call's two runs are consecutive in its thread) keyed by the
// instruction pointer: "skipped" while the new generation is not current,
// so the old copy counts the call, or "counted" once it is, so the old
// copy does not. A copy that finds no word from a newer one counts the
// call if its generation is current or older: at a site only in the old
// set until its link is closed, and, since Linux 6.12 runs at a return
// only the consumers that were there at the call's entry, at the return
// of a call that entered before the new link existed.
//
// Between the switch and closing the old links, Update waits for the
// calls in flight (a uprobe link's Close waits an RCU grace period of the
// uprobe handlers): from 6.12 the handlers walk the consumers under RCU,
// and an old consumer unlinked while a call had run only the new one
// would miss that call.
//
// Closing a link's descriptor does not always detach it at once: a child
// this process forks at that moment holds a copy of every descriptor until
// its exec closes them, and a walker of the kernel's links holds the one it
// opened; the kernel frees the link's ID before it unlinks the consumers.
// So once the old set's links are about to be closed, Update marks the
// generations that no kept link runs as retired (one slot per generation,
// modulo genRetiredSlots, holding the generation retired), and a copy of a
// retired generation counts nothing: a link still attached for a moment
// after Update (or an updatable Link's Close) returned stays silent. Only
// a copy older than the current generation reads the mark.

// The maps of a Link's generation check, by the names its copies refer
// to them by.
const (
	genStateName = "mp_gen_state"
	genSlotsName = "mp_gen_slots"
	// genSlots bounds the threads in an update's overlap at once; a slot
	// lives for one call's two runs, so eviction needs that many threads
	// to hit probes between them.
	genSlots = 16384
	// genRetiredName's slots: a generation's slot is taken again
	// genRetiredSlots updates later, long after its links are gone.
	genRetiredName  = "mp_gen_retired"
	genRetiredSlots = 64
)

// genStateSpec is one u64: the current generation in the low 32 bits,
// overlap in the high ones.
func genStateSpec() *ebpf.MapSpec {
	return &ebpf.MapSpec{Name: genStateName, Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1}
}

// genSlotsSpec maps a thread id to the word a newer copy left: the
// instruction pointer (u64), the generation that wrote it (u32, 0 once
// read), and whether it counted the call (u32).
func genSlotsSpec() *ebpf.MapSpec {
	return &ebpf.MapSpec{Name: genSlotsName, Type: ebpf.LRUHash, KeySize: 4, ValueSize: 16, MaxEntries: genSlots}
}

// genRetiredSpec holds, in slot g%genRetiredSlots, the generation g last
// retired there (u32).
func genRetiredSpec() *ebpf.MapSpec {
	return &ebpf.MapSpec{Name: genRetiredName, Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: genRetiredSlots}
}

// newGenMaps creates a Link's generation maps, with gen current.
func newGenMaps(gen uint32) (state, slots, retired *ebpf.Map, err error) {
	if state, err = ebpf.NewMap(genStateSpec()); err != nil {
		return nil, nil, nil, fmt.Errorf("multiprobe: creating %s: %w", genStateName, err)
	}
	if slots, err = ebpf.NewMap(genSlotsSpec()); err != nil {
		state.Close()
		return nil, nil, nil, fmt.Errorf("multiprobe: creating %s: %w", genSlotsName, err)
	}
	if retired, err = newGenRetired(); err != nil {
		state.Close()
		slots.Close()
		return nil, nil, nil, err
	}
	if err := setGenState(state, gen, false); err != nil {
		state.Close()
		slots.Close()
		retired.Close()
		return nil, nil, nil, err
	}
	return state, slots, retired, nil
}

// newGenRetired creates the map of retired generations.
func newGenRetired() (*ebpf.Map, error) {
	m, err := ebpf.NewMap(genRetiredSpec())
	if err != nil {
		return nil, fmt.Errorf("multiprobe: creating %s: %w", genRetiredName, err)
	}
	return m, nil
}

// retireGens marks gens retired: their copies count nothing from now on.
func retireGens(m *ebpf.Map, gens []uint32) error {
	for _, g := range gens {
		if err := m.Put(g%genRetiredSlots, g); err != nil {
			return fmt.Errorf("multiprobe: writing %s: %w", genRetiredName, err)
		}
	}
	return nil
}

// setGenState writes the current generation and overlap in one value.
func setGenState(m *ebpf.Map, gen uint32, overlap bool) error {
	v := uint64(gen)
	if overlap {
		v |= 1 << 32
	}
	if err := m.Put(uint32(0), binary.NativeEndian.AppendUint64(nil, v)); err != nil {
		return fmt.Errorf("multiprobe: writing %s: %w", genStateName, err)
	}
	return nil
}

// injectGen prepends the generation check of generation gen to p, which
// refers to the maps by genStateName and genSlotsName.
func injectGen(p *ebpf.ProgramSpec, gen uint32) error {
	ip := usdt.HostArch().IPOffset()
	if ip < 0 {
		return fmt.Errorf("multiprobe: no generation check on this architecture: %w", ebpf.ErrNotSupported)
	}
	prologue.Prepend(p, genCheck(int32(gen), ip))
	return nil
}

// genCheck returns the check of generation gen (see the comment at the top
// of this file); ip is the instruction pointer's offset in the context.
// r6 keeps the context, r7 the current generation, r8 whether an update
// is under way and then the instruction pointer, r9 what a newer copy said (0 nothing, 1 skipped, 2 counted);
// the program's own code defines whatever it uses. The stack below fp-24
// is free again once the program runs.
func genCheck(gen int32, ip int16) asm.Instructions {
	const (
		key   = -4  // u32: 0, then the thread id
		value = -24 // a slot: ip, gen, counted
		body  = prologue.Label("body")
		skip  = prologue.Label("skip")
		over  = prologue.Label("overlap")
		dec   = prologue.Label("decide")
		old   = prologue.Label("notnew")
		live  = prologue.Label("live")
	)
	j := func(ins asm.Instruction, to prologue.Label) prologue.Jump {
		return prologue.Jump{Instruction: ins, To: to}
	}
	writeSlot := func(counted int32) []any {
		return []any{
			asm.StoreMem(asm.RFP, value, asm.R8, asm.DWord),
			asm.StoreImm(asm.RFP, value+8, int64(gen), asm.Word),
			asm.StoreImm(asm.RFP, value+12, int64(counted), asm.Word),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, key),
			asm.Mov.Reg(asm.R3, asm.RFP),
			asm.Add.Imm(asm.R3, value),
			asm.Mov.Imm(asm.R4, 0), // BPF_ANY
			asm.LoadMapPtr(asm.R1, 0).WithReference(genSlotsName),
			asm.FnMapUpdateElem.Call(),
		}
	}
	items := []any{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.StoreImm(asm.RFP, key, 0, asm.Word),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, key),
		asm.LoadMapPtr(asm.R1, 0).WithReference(genStateName),
		asm.FnMapLookupElem.Call(),
		j(asm.JEq.Imm(asm.R0, 0, ""), body),
		asm.LoadMem(asm.R7, asm.R0, 0, asm.DWord),
		asm.Mov.Reg(asm.R8, asm.R7), // overlap, until the ip is loaded
		asm.RSh.Imm(asm.R8, 32),
		asm.LSh.Imm(asm.R7, 32),
		asm.RSh.Imm(asm.R7, 32),
		// An older copy first asks whether its generation is retired.
		j(asm.JLE.Imm(asm.R7, gen, ""), live),
		asm.StoreImm(asm.RFP, key, int64(uint32(gen)%genRetiredSlots), asm.Word),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, key),
		asm.LoadMapPtr(asm.R1, 0).WithReference(genRetiredName),
		asm.FnMapLookupElem.Call(),
		j(asm.JEq.Imm(asm.R0, 0, ""), live),
		asm.LoadMem(asm.R1, asm.R0, 0, asm.Word),
		j(asm.JEq.Imm(asm.R1, gen, ""), skip),

		live,
		j(asm.JNE.Imm(asm.R8, 0, ""), over),
		j(asm.JLT.Imm(asm.R7, gen, ""), skip), // a newer copy made before its switch
		j(asm.Ja.Label(""), body),

		over,
		asm.FnGetCurrentPidTgid.Call(),
		asm.StoreMem(asm.RFP, key, asm.R0, asm.Word), // the thread id
		asm.LoadMem(asm.R8, asm.R6, ip, asm.DWord),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, key),
		asm.LoadMapPtr(asm.R1, 0).WithReference(genSlotsName),
		asm.FnMapLookupElem.Call(),
		asm.Mov.Imm(asm.R9, 0),
		j(asm.JEq.Imm(asm.R0, 0, ""), dec),
		asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
		j(asm.JNE.Reg(asm.R1, asm.R8, ""), dec),
		asm.LoadMem(asm.R1, asm.R0, 8, asm.Word),
		j(asm.JLE.Imm(asm.R1, gen, ""), dec),
		asm.LoadMem(asm.R9, asm.R0, 12, asm.Word),
		asm.Add.Imm(asm.R9, 1),
		asm.StoreImm(asm.R0, 8, 0, asm.Word), // read: no one else takes it

		dec,
		j(asm.JGE.Imm(asm.R7, gen, ""), old),
	}
	items = append(items, writeSlot(0)...) // the new copy before the switch
	items = append(items,
		j(asm.Ja.Label(""), skip),
		old,
		j(asm.JEq.Imm(asm.R9, 2, ""), skip),
		j(asm.JEq.Imm(asm.R9, 1, ""), body),
	)
	items = append(items, writeSlot(1)...) // no newer copy ran: count, and say so
	items = append(items,
		j(asm.Ja.Label(""), body),
		skip,
		asm.Mov.Imm(asm.R0, 0),
		asm.Return(),
		body,
		asm.Mov.Reg(asm.R1, asm.R6),
	)
	return prologue.Resolve(items...)
}
