// Package prologue prepends instructions to a BPF program spec, for the
// checks that pidfilter and the root package's generation check put in
// front of a user's program.
package prologue

import (
	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
)

// Prepend puts pro in front of p's instructions. pro must leave r1 as the
// context, as the program expects it on entry, and jump only within
// itself or to its end. The entry's symbol (what bpf-to-bpf calls and the
// kernel's func info name) and BTF func info move to pro's first
// instruction; the line info is copied, because the kernel wants line
// info at the start of every function. So bpf-to-bpf calls, global
// functions and tail calls verify as before.
func Prepend(p *ebpf.ProgramSpec, pro asm.Instructions) {
	pro = append(asm.Instructions(nil), pro...)
	first := p.Instructions[0]
	pro[0] = pro[0].WithSymbol(first.Symbol())
	if fn := btf.FuncMetadata(&first); fn != nil {
		pro[0] = btf.WithFuncMetadata(pro[0], fn)
		first = btf.WithFuncMetadata(first, nil)
	}
	if src := first.Source(); src != nil {
		pro[0] = pro[0].WithSource(src)
	}
	first = first.WithSymbol("")

	insns := make(asm.Instructions, 0, len(pro)+len(p.Instructions))
	insns = append(insns, pro...)
	insns = append(insns, first)
	insns = append(insns, p.Instructions[1:]...)
	p.Instructions = insns
}

// Label names a jump target in [Resolve]'s input.
type Label string

// Jump is a jump instruction to a label, for [Resolve].
type Jump struct {
	asm.Instruction
	To Label
}

// Resolve assembles items (asm.Instruction, Jump, or Label, which marks
// the next instruction) into instructions with the jumps' offsets set:
// offsets count 8-byte slots, and a map load takes two, which makes them
// error-prone to count by hand. A label that is never defined points past
// the last instruction.
func Resolve(items ...any) asm.Instructions {
	var insns asm.Instructions
	at := map[Label]int{} // label -> slot
	var jumps []struct {
		index, slot int
		to          Label
	}
	slot := 0
	for _, it := range items {
		switch v := it.(type) {
		case Label:
			at[v] = slot
		case Jump:
			jumps = append(jumps, struct {
				index, slot int
				to          Label
			}{len(insns), slot, v.To})
			insns = append(insns, v.Instruction)
			slot += int(v.Instruction.Size() / asm.InstructionSize)
		case asm.Instruction:
			insns = append(insns, v)
			slot += int(v.Size() / asm.InstructionSize)
		}
	}
	for _, j := range jumps {
		to, ok := at[j.to]
		if !ok {
			to = slot
		}
		insns[j.index].Offset = int16(to - j.slot - 1)
	}
	return insns
}
