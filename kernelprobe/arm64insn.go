package kernelprobe

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/arch/arm64/arm64asm"
)

// The kernel's rules for arm64 (arch/arm64/kernel/probes/decode-insn.c,
// arm_probe_decode_insn; the masks are arch/arm64/include/asm/insn.h's).
// An instruction is stepped out of line unless it reads or writes the PC,
// raises an exception, or is an exclusive load or store (whose monitor the
// step's exception clears); of those, the kernel simulates the plain
// branches, adr and adrp, and the literal loads, and refuses the rest:
// system register writes, reads of DAIF, exception generation
// (svc, brk, ...), hints other than nop, BTI and pointer signing, the
// authenticated branches (braa, retaa, ...), prfm of a literal, and
// exclusive loads and stores. The kernel refuses with EINVAL.

type arm64Insn struct{ mask, val uint32 }

func (p arm64Insn) is(insn uint32) bool { return insn&p.mask == p.val }

var (
	arm64B        = arm64Insn{0xFC000000, 0x14000000}
	arm64BL       = arm64Insn{0xFC000000, 0x94000000}
	arm64CBZ      = arm64Insn{0x7F000000, 0x34000000}
	arm64CBNZ     = arm64Insn{0x7F000000, 0x35000000}
	arm64TBZ      = arm64Insn{0x7F000000, 0x36000000}
	arm64TBNZ     = arm64Insn{0x7F000000, 0x37000000}
	arm64BCond    = arm64Insn{0xFF000010, 0x54000000}
	arm64BR       = arm64Insn{0xFFFFFC1F, 0xD61F0000}
	arm64BRAuth   = arm64Insn{0xFEFFF800, 0xD61F0800}
	arm64BLR      = arm64Insn{0xFFFFFC1F, 0xD63F0000}
	arm64BLRAuth  = arm64Insn{0xFEFFF800, 0xD63F0800}
	arm64Ret      = arm64Insn{0xFFFFFC1F, 0xD65F0000}
	arm64RetAuth  = arm64Insn{0xFFFFFBFF, 0xD65F0BFF}
	arm64Eret     = arm64Insn{0xFFFFFFFF, 0xD69F03E0}
	arm64EretAuth = arm64Insn{0xFFFFFBFF, 0xD69F0BFF}
	arm64Except   = arm64Insn{0xFF000000, 0xD4000000}
	arm64Hint     = arm64Insn{0xFFFFF01F, 0xD503201F}
	arm64MRS      = arm64Insn{0xFFF00000, 0xD5300000}
	arm64MSRImm   = arm64Insn{0xFFF8F01F, 0xD500401F}
	arm64MSRReg   = arm64Insn{0xFFF00000, 0xD5100000}
	arm64ADR      = arm64Insn{0x9F000000, 0x10000000}
	arm64ADRP     = arm64Insn{0x9F000000, 0x90000000}
	arm64LDRLit   = arm64Insn{0xBF000000, 0x18000000}
	arm64LDRSWLit = arm64Insn{0xFF000000, 0x98000000}
	arm64PRFMLit  = arm64Insn{0xFF000000, 0xD8000000}
	arm64Excl     = arm64Insn{0x3F800000, 0x08000000}
)

// arm64SteppableHints are the hints the kernel steps (insn & 0xfe0): nop,
// xpaclri, the pacia/pacib forms, and bti's.
var arm64SteppableHints = map[uint32]bool{
	0x000: true, 0x0e0: true, 0x100: true, 0x140: true, 0x300: true, 0x320: true,
	0x340: true, 0x360: true, 0x400: true, 0x440: true, 0x480: true, 0x4c0: true,
}

// arm64DAIF is the one system register MRS may not read in a step.
const arm64DAIF = 0xda11

func checkARM64(code []byte) error {
	if len(code) < 4 {
		return &InsnError{Insn: fmt.Sprintf("% x", code), Reason: "it does not decode"}
	}
	insn := binary.LittleEndian.Uint32(code)
	why := arm64Refusal(insn)
	if why == "" {
		return nil
	}
	name := fmt.Sprintf("%08x", insn)
	if inst, err := arm64asm.Decode(code[:4]); err == nil {
		name = arm64asm.GNUSyntax(inst)
	}
	return &InsnError{Insn: name, Reason: "the kernel neither steps nor simulates " + why}
}

// arm64Refusal says what insn is if the kernel refuses it, or "".
func arm64Refusal(insn uint32) string {
	if class := insn >> 25 & 0xf; class == 0xa || class == 0xb { // branch, exception, system
		switch {
		case arm64BRAuth.is(insn), arm64BLRAuth.is(insn), arm64RetAuth.is(insn):
			return "an authenticated branch"
		case arm64B.is(insn), arm64BL.is(insn), arm64CBZ.is(insn), arm64CBNZ.is(insn), arm64TBZ.is(insn),
			arm64TBNZ.is(insn), arm64BCond.is(insn), arm64BR.is(insn), arm64BLR.is(insn), arm64Ret.is(insn):
			return "" // simulated
		case arm64MSRImm.is(insn), arm64MSRReg.is(insn):
			return "a system register write"
		case arm64Except.is(insn):
			return "an exception-generating instruction"
		case arm64Eret.is(insn), arm64EretAuth.is(insn):
			return "an exception return"
		case arm64MRS.is(insn):
			// Any system register reads right in a step but DAIF,
			// whose interrupt masks the step itself changes.
			if insn&0x1fffe0>>5 == arm64DAIF {
				return "a read of DAIF"
			}
		case arm64Hint.is(insn):
			if !arm64SteppableHints[insn&0xfe0] {
				return "this hint"
			}
		}
		return ""
	}
	switch {
	case arm64PRFMLit.is(insn):
		return "a prefetch of a literal"
	case arm64Excl.is(insn):
		return "an exclusive load or store"
	}
	// The literal loads, adr and adrp read the PC and are simulated.
	return ""
}
