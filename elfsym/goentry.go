package elfsym

import (
	"debug/elf"

	"golang.org/x/arch/arm64/arm64asm"
	"golang.org/x/arch/x86/x86asm"
)

// A Go function (ABIInternal, Go 1.17 and later) starts by comparing the
// stack pointer with the goroutine's stack bound, g.stackguard0 at offset
// 16 of the g, and branching away when the stack must grow: to
// runtime.morestack, which grows the stack and then jumps back to the
// function's first instruction. A probe on that instruction fires again
// each time, so an entry probe belongs after the branch, where the body
// starts. The argument registers are untouched up to there: the check
// uses g's register (R14 on x86-64, R28 on arm64) and scratch registers
// (R12; R16, R17, R27) that are not arguments.
//
//	x86-64:	CMPQ SP, 16(R14); JBE morestack
//		or LEAQ -N(SP), R12; CMPQ R12, 16(R14); JBE
//		or MOVQ SP, R12; SUBQ $N, R12; JB; CMPQ R12, 16(R14); JBE
//	arm64:	MOVD 16(R28), R16; CMP R16, RSP; BLS morestack
//		or MOVD 16(R28), R16; SUB $N, RSP, R17; CMP R16, R17; BLS
//		or with SUBS and BCC first for a huge frame
//
// The instructions are decoded, not matched as bytes, so that an encoding
// the compiler varies (register, displacement width) is still read right.

// goEntryWindow is how many bytes of a function goEntry decodes: the
// longest check above is 26 bytes on x86-64, 24 on arm64.
const goEntryWindow = 32

// goEntry returns where the body of the Go function whose first bytes are
// code starts, as an offset from its first instruction, or 0 when the
// function has no stack check (a nosplit function, assembly, C code
// linked in with cgo): there the first instruction runs once per call.
func goEntry(machine elf.Machine, code []byte) int {
	switch machine {
	case elf.EM_X86_64:
		return goEntryX86(code)
	case elf.EM_AARCH64:
		return goEntryARM64(code)
	}
	return 0
}

func goEntryX86(code []byte) int {
	at, checked := 0, false
	for n := 0; n < 6 && at < len(code); n++ {
		inst, err := x86asm.Decode(code[at:], 64)
		if err != nil {
			return 0
		}
		at += inst.Len
		switch inst.Op {
		case x86asm.CMP:
			checked = isStackGuard(inst.Args[0]) || isStackGuard(inst.Args[1])
		case x86asm.JBE:
			if checked {
				return at
			}
			return 0
		case x86asm.MOV, x86asm.LEA, x86asm.SUB, x86asm.JB:
			// The frame size computed into R12, and the branch for a
			// frame larger than the stack's address.
		default:
			return 0
		}
	}
	return 0
}

// isStackGuard reports whether a is 16(R14): g.stackguard0.
func isStackGuard(a x86asm.Arg) bool {
	m, ok := a.(x86asm.Mem)
	return ok && m.Base == x86asm.R14 && m.Index == 0 && m.Disp == 16 && m.Segment == 0
}

func goEntryARM64(code []byte) int {
	loaded := false
	for at := 0; at+4 <= len(code) && at < 24; at += 4 {
		inst, err := arm64asm.Decode(code[at : at+4])
		if err != nil {
			return 0
		}
		switch {
		case at == 0:
			// MOVD 16(R28), R16: the check starts with loading the
			// bound, or there is no check.
			loaded = inst.Op == arm64asm.LDR && isStackGuardARM64(inst.Args[1])
			if !loaded {
				return 0
			}
		case inst.Op == arm64asm.B:
			c, ok := inst.Args[0].(arm64asm.Cond)
			if !ok {
				return 0
			}
			switch c.String() {
			case "LS":
				return at + 4
			case "CC", "LO":
				// A huge frame's wrap-around check.
			default:
				return 0
			}
		case inst.Op == arm64asm.CMP, inst.Op == arm64asm.SUB, inst.Op == arm64asm.SUBS,
			inst.Op == arm64asm.MOV, inst.Op == arm64asm.MOVZ:
		default:
			return 0
		}
	}
	return 0
}

// isStackGuardARM64 reports whether a is [X28,#16]: g.stackguard0.
func isStackGuardARM64(a arm64asm.Arg) bool {
	m, ok := a.(arm64asm.MemImmediate)
	if !ok || m.Base != arm64asm.RegSP(arm64asm.X28) {
		return false
	}
	return m.String() == "[X28,#16]"
}
