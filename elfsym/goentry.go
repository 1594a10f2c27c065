package elfsym

import (
	"debug/elf"
	"fmt"
	"strings"

	"github.com/multiprobe/multiprobe/internal/x86dec"
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
// longest check above is 26 bytes on x86-64, 24 on arm64, where two
// instructions of a restartable sequence may follow (pastRestartable).
const goEntryWindow = 48

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
		inst, err := x86dec.Decode(code[at:])
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
				return max(pastRestartable(code, at+4), 0)
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

// pastRestartable returns the offset of the first instruction at or after
// at that does not use R27, the arm64 assembler's temporary register
// (REGTMP). Go marks a sequence of instructions that uses it as
// restartable: when a goroutine is preempted by signal inside one, the
// runtime resumes it at the sequence's first instruction, which then runs
// again. A huge frame is set up that way (MOVD $N, R27; SUB R27, RSP,
// R20), so a probe there would count a call once more each time a
// preemption lands on the SUB: measured, main.Big counted 101 calls for
// 100 in 7 runs of 16. Past the sequence, an instruction runs once per
// call. -1 if the sequence reaches the end of code: then the symbol's
// address serves.
func pastRestartable(code []byte, at int) int {
	for ; at+4 <= len(code); at += 4 {
		inst, err := arm64asm.Decode(code[at : at+4])
		if err != nil || !usesRegTmp(inst) {
			return at
		}
	}
	return -1
}

// usesRegTmp reports whether inst reads or writes X27 (or W27) in any of
// its operands: as a register, a base or an index. The operand types that
// can hold a register are many; their formatting names it the same way.
func usesRegTmp(inst arm64asm.Inst) bool {
	for _, a := range inst.Args {
		if a == nil {
			break
		}
		if s := a.String(); strings.Contains(s, "X27") || strings.Contains(s, "W27") {
			return true
		}
	}
	return false
}

// isStackGuardARM64 reports whether a is [X28,#16]: g.stackguard0.
func isStackGuardARM64(a arm64asm.Arg) bool {
	m, ok := a.(arm64asm.MemImmediate)
	if !ok || m.Base != arm64asm.RegSP(arm64asm.X28) {
		return false
	}
	return m.String() == "[X28,#16]"
}

// GoReturns returns, for each site of a Go program's Selection in the
// order of Offsets, the file offsets of its function's return
// instructions. Probing those with entry probes is how a Go function's
// returns are seen: the kernel's return probe replaces the return address
// on the stack, which Go's stack copier and unwinder cannot walk (the
// program dies with "unexpected return pc"). There, the results are still
// in their registers (ABIInternal: RAX, RBX, ... on x86-64; R0, R1, ... on
// arm64), where a return probe would read them. A function that never
// returns has none.
//
// It decodes each function whole, within its symbol's size, so it reads
// the file: call it before the File is closed. It fails with
// ErrUnsupported for a file that is not a Go program, or a function that
// leaves by a jump to another function (a tail call, whose return would
// not be seen) or that does not decode.
func (s *Selection) GoReturns() ([][]uint64, error) {
	f := s.goFile
	if f == nil {
		return nil, fmt.Errorf("%w: return instructions are decoded for Go programs only", ErrUnsupported)
	}
	f.mu.Lock()
	closed := f.closed
	f.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("%s: GoReturns on a closed File", f.path)
	}
	out := make([][]uint64, len(s.symOffsets))
	var code []byte
	for i, start := range s.symOffsets {
		size := s.sizes[i]
		if size == 0 || size > 1<<24 {
			return nil, fmt.Errorf("%s: %w: function at %#x has size %d: its return instructions cannot be found",
				f.path, ErrUnsupported, start, size)
		}
		if uint64(cap(code)) < size {
			code = make([]byte, size)
		}
		code = code[:size]
		if n, err := f.goCode.ReadAt(code, int64(start)); uint64(n) != size {
			return nil, fmt.Errorf("%s: reading the function at %#x: %w", f.path, start, err)
		}
		rets, err := goReturns(f.machine, code)
		if err != nil {
			return nil, fmt.Errorf("%s: %w: function at %#x: %w", f.path, ErrUnsupported, start, err)
		}
		for j := range rets {
			rets[j] += start
		}
		out[i] = rets
	}
	return out, nil
}

// goReturns returns the offsets in code, one function's, of its return
// instructions.
func goReturns(machine elf.Machine, code []byte) ([]uint64, error) {
	var rets []uint64
	switch machine {
	case elf.EM_X86_64:
		for at := 0; at < len(code); {
			inst, err := x86dec.Decode(code[at:])
			if err != nil {
				return nil, fmt.Errorf("at +%#x: %w", at, err)
			}
			switch inst.Op {
			case x86asm.RET:
				rets = append(rets, uint64(at))
			case x86asm.JMP:
				if rel, ok := inst.Args[0].(x86asm.Rel); ok {
					if to := at + inst.Len + int(rel); to < 0 || to >= len(code) {
						return nil, fmt.Errorf("at +%#x: a jump out of the function (a tail call)", at)
					}
				}
				// An indirect jump is a jump table's (a switch), within
				// the function.
			}
			at += inst.Len
		}
	case elf.EM_AARCH64:
		for at := 0; at+4 <= len(code); at += 4 {
			inst, err := arm64asm.Decode(code[at : at+4])
			if err != nil {
				// An instruction the decoder does not know (a newer
				// extension's, or padding) is neither a return nor a
				// branch, which are all in the base set, and takes 4
				// bytes like any other.
				continue
			}
			switch inst.Op {
			case arm64asm.RET:
				rets = append(rets, uint64(at))
			case arm64asm.B:
				if _, cond := inst.Args[0].(arm64asm.Cond); cond {
					continue
				}
				if rel, ok := inst.Args[0].(arm64asm.PCRel); ok {
					if to := at + int(rel); to < 0 || to >= len(code) {
						return nil, fmt.Errorf("at +%#x: a branch out of the function (a tail call)", at)
					}
				}
			}
		}
	default:
		return nil, fmt.Errorf("no decoder for %s", machine)
	}
	return rets, nil
}
