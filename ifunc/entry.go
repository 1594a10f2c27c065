package ifunc

import (
	"debug/elf"

	"github.com/multiprobe/multiprobe/internal/x86dec"
	"golang.org/x/arch/x86/x86asm"
)

// EntryWindow is how much of an implementation's code Entry wants: enough
// to see the jumps of a string function's body.
const EntryWindow = 4096

// Entry returns how far into an implementation, whose first bytes are
// code, a uprobe must go, and why when not 0.
//
// The x86 kernels we know (5.10 to 6.18) refuse a uprobe on some
// VEX-encoded instructions: they check the opcode byte against the table
// of one-byte opcodes, where 0x6e and 0x6f (vmovd, vmovdqu: how AVX2
// string functions start) are the port I/O instructions it never steps.
// glibc's AVX2 implementations of strchr, strlen and others start with
// one. Such a first instruction, when it writes only vector registers,
// can be stepped over: the arguments are still in their registers after
// it, and the entry is still reached once per call, provided no jump
// lands on the second instruction, which Entry checks over the next
// EntryWindow bytes. Otherwise it returns 0 and the kernel is left to
// accept the first instruction or refuse it by name.
func Entry(machine elf.Machine, code []byte) (skip int, why string) {
	if machine != elf.EM_X86_64 || len(code) == 0 {
		return 0, ""
	}
	if b := code[0]; b != 0xc4 && b != 0xc5 && b != 0x62 { // VEX3, VEX2, EVEX
		return 0, ""
	}
	first, err := x86dec.Decode(code)
	if err != nil {
		return 0, ""
	}
	if dst, ok := first.Args[0].(x86asm.Reg); !ok || !isVector(dst) {
		return 0, "" // it writes memory or a general register: not skipped
	}
	skip = first.Len
	for at := skip; at < len(code); {
		inst, err := x86dec.Decode(code[at:])
		if err != nil {
			break // past what decodes (another function, data): nothing to see
		}
		for _, a := range inst.Args {
			if rel, ok := a.(x86asm.Rel); ok && at+inst.Len+int(rel) == skip {
				return 0, ""
			}
		}
		at += inst.Len
	}
	return skip, "after its first instruction, a VEX-encoded " + first.Op.String() + ", which uprobes may refuse"
}

// isVector reports whether r is an XMM, YMM, ZMM or mask register.
func isVector(r x86asm.Reg) bool {
	return r >= x86asm.X0 && r <= x86asm.Z31 || r >= x86asm.K0 && r <= x86asm.K7
}
