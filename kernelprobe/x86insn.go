package kernelprobe

import (
	"fmt"

	"github.com/multiprobe/multiprobe/internal/x86dec"
	"golang.org/x/arch/x86/x86asm"
)

// The kernel's rules for x86-64 (arch/x86/kernel/uprobes.c,
// uprobe_init_insn and branch_setup_xol_ops), as its instruction decoder
// sees an instruction: legacy prefixes, a REX prefix, then either a VEX
// or EVEX prefix and one opcode byte, or one to three opcode bytes.
//
//   - An ES, CS, SS or DS segment prefix, or a lock prefix, anywhere among
//     the legacy prefixes: refused (glibc's pthread_spin_lock starts with
//     lock decl; a notrack indirect jump is a DS prefix).
//   - mov to SS and pop SS, which mask an exception for one instruction.
//   - The first opcode byte is looked up in a table of one-byte opcodes,
//     even when a VEX or EVEX prefix gives it another meaning: there 0x6e
//     and 0x6f (vmovd, vmovdqu, how AVX2 string functions start) are port
//     I/O, and 0xef (vpxor) too. Refused: port I/O, int3, int1, int N,
//     into, iret, hlt, cli, sti, and what 64-bit mode has no more.
//   - A relative jump or call with an operand-size (0x66) prefix.
//   - An instruction its decoder does not know (ENOEXEC rather than
//     ENOTSUPP): among VEX-encoded ones, AMD's FMA4 and XOP.
//
// A legacy 0x0f escape is in the table as good, so no two- or three-byte
// opcode is refused for its own sake.

// badX86Opcodes are the one-byte opcodes the kernel's good_insns_64 table
// leaves out, with what each is.
var badX86Opcodes = map[byte]string{
	0x06: "invalid in 64-bit mode", 0x07: "invalid in 64-bit mode", 0x0e: "invalid in 64-bit mode",
	0x16: "invalid in 64-bit mode", 0x17: "pop %ss", 0x1e: "invalid in 64-bit mode", 0x1f: "invalid in 64-bit mode",
	0x27: "invalid in 64-bit mode", 0x2f: "invalid in 64-bit mode", 0x37: "invalid in 64-bit mode", 0x3f: "invalid in 64-bit mode",
	0x60: "invalid in 64-bit mode", 0x61: "invalid in 64-bit mode", 0x62: "invalid in 64-bit mode",
	0x6c: "port I/O", 0x6d: "port I/O", 0x6e: "port I/O", 0x6f: "port I/O",
	0x82: "invalid in 64-bit mode", 0x9a: "invalid in 64-bit mode",
	0xcc: "int3", 0xcd: "int N", 0xce: "invalid in 64-bit mode", 0xcf: "iret",
	0xd4: "invalid in 64-bit mode", 0xd5: "invalid in 64-bit mode", 0xd6: "invalid in 64-bit mode",
	0xe4: "port I/O", 0xe5: "port I/O", 0xe6: "port I/O", 0xe7: "port I/O", 0xea: "invalid in 64-bit mode",
	0xec: "port I/O", 0xed: "port I/O", 0xee: "port I/O", 0xef: "port I/O",
	0xf1: "int1", 0xf4: "hlt", 0xfa: "cli", 0xfb: "sti",
}

func checkX86(code []byte) error {
	refuse := func(reason string, args ...any) error {
		return &InsnError{Insn: x86Name(code), Reason: fmt.Sprintf(reason, args...)}
	}
	i := 0
	opsize := false
prefixes:
	for ; i < len(code) && i < 14; i++ {
		switch p := code[i]; p {
		case 0x26, 0x2e, 0x36, 0x3e:
			return refuse("the kernel does not single-step an instruction with a segment prefix (%#02x)", p)
		case 0xf0:
			return refuse("the kernel does not single-step an instruction with a lock prefix")
		case 0x66:
			opsize = true
		case 0x64, 0x65, 0x67, 0xf2, 0xf3:
		default:
			break prefixes
		}
	}
	if i < len(code) && code[i]&0xf0 == 0x40 { // REX
		i++
	}
	vex, vexMap := "", byte(1)
	switch {
	case i >= len(code):
		return refuse("it does not decode")
	case code[i] == 0xc5: // two-byte VEX: c5, one byte of fields, the opcode
		vex, i = "VEX", i+2
	case code[i] == 0xc4: // three-byte VEX: c4, the map and more, a byte of fields
		if i+1 < len(code) {
			vexMap = code[i+1] & 0x1f
		}
		vex, i = "VEX", i+3
	case code[i] == 0x62: // EVEX: 62 and three bytes of fields
		vex, i = "EVEX", i+4
	}
	if i >= len(code) {
		return refuse("it does not decode")
	}
	op := code[i]
	if what, bad := badX86Opcodes[op]; bad {
		if vex != "" {
			return refuse("the kernel looks the opcode byte (%#02x) of this %s-encoded instruction up in its table of one-byte opcodes, where it is %s, which it does not single-step", op, vex, what)
		}
		return refuse("the kernel does not single-step %s", what)
	}
	if vex == "VEX" && unknownVEX(vexMap, op) {
		return refuse("the kernel's instruction decoder does not know this VEX-encoded opcode (map %d, %#02x)", vexMap, op)
	}
	if vex != "" {
		return nil
	}
	if op == 0x8e && i+1 < len(code) && code[i+1]>>3&7 == 2 {
		return refuse("the kernel does not single-step a mov to %%ss, which masks an exception")
	}
	branch := op == 0xe8 || op == 0xe9 || op == 0xeb || op >= 0x70 && op <= 0x7f ||
		op == 0x0f && i+1 < len(code) && code[i+1] >= 0x80 && code[i+1] <= 0x8f
	if branch && opsize {
		return refuse("the kernel does not emulate a relative jump or call with an operand-size prefix")
	}
	return nil
}

// unknownVEX reports whether the kernel's instruction decoder fails on the
// VEX-encoded opcode op of map vexMap (1 is 0f, 2 0f38, 3 0f3a), with
// ENOEXEC: its tables (arch/x86/lib/x86-opcode-map.txt) have Intel's
// VEX opcodes, not AMD's FMA4 (glibc's libm has __fma_fma4, which starts
// with vfmaddsd) nor VPERMIL2PS/PD, nor maps past 3.
func unknownVEX(vexMap, op byte) bool {
	switch vexMap {
	case 1, 2:
		return false
	case 3:
		return op == 0x48 || op == 0x49 || op >= 0x5c && op <= 0x5f || op >= 0x68 && op <= 0x6f || op >= 0x78 && op <= 0x7f
	}
	return true
}

// x86Name disassembles the instruction at the start of code in AT&T
// syntax, as objdump and perf write it, or gives its bytes where the
// decoder does not know it (AVX-512's EVEX encodings).
func x86Name(code []byte) string {
	if inst, err := x86dec.Decode(code); err == nil {
		return x86asm.GNUSyntax(inst, 0, nil)
	}
	if len(code) == 0 {
		return "(no bytes)"
	}
	return fmt.Sprintf("% x", code[:min(len(code), 8)])
}
