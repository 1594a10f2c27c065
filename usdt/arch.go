package usdt

import (
	"debug/elf"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/multiprobe/multiprobe/internal/hostarch"
)

// Arch is the instruction set a binary's argument strings are written for.
// It comes from the ELF header, not from the host, so that probes of a
// binary built for another machine can still be listed.
type Arch uint8

// The architectures whose argument strings this package decodes.
const (
	ArchUnknown Arch = iota
	ArchX86_64
	ArchARM64
	ArchRISCV64
	ArchS390X
	ArchPPC64LE
)

var archNames = [...]string{
	ArchUnknown: "unknown",
	ArchX86_64:  "x86_64",
	ArchARM64:   "arm64",
	ArchRISCV64: "riscv64",
	ArchS390X:   "s390x",
	ArchPPC64LE: "ppc64le",
}

// String returns the name used in error messages and listings.
func (a Arch) String() string {
	if int(a) < len(archNames) {
		return archNames[a]
	}
	return "Arch(" + strconv.Itoa(int(a)) + ")"
}

// MarshalText makes Arch print by name in JSON listings.
func (a Arch) MarshalText() ([]byte, error) { return []byte(a.String()), nil }

// UnmarshalText reads what MarshalText wrote.
func (a *Arch) UnmarshalText(text []byte) error {
	for v, name := range archNames {
		if name == string(text) {
			*a = Arch(v)
			return nil
		}
	}
	return fmt.Errorf("usdt: %q is not an architecture", text)
}

// IPOffset is the offset of the instruction pointer in the kernel's struct
// pt_regs of a, which a uprobe program's context is; -1 for ArchUnknown.
func (a Arch) IPOffset() int16 { return ipOffset(a) }

// archOf maps an ELF machine to an Arch. Only 64-bit ELF files are
// accepted: the BPF side reads 64-bit registers.
func archOf(f *elf.File) (Arch, error) {
	if f.Class != elf.ELFCLASS64 {
		return ArchUnknown, fmt.Errorf("%w: %s ELF (only 64-bit binaries are supported)", ErrUnsupportedArch, f.Class)
	}
	switch f.Machine {
	case elf.EM_X86_64:
		return ArchX86_64, nil
	case elf.EM_AARCH64:
		return ArchARM64, nil
	case elf.EM_RISCV:
		return ArchRISCV64, nil
	case elf.EM_S390:
		return ArchS390X, nil
	case elf.EM_PPC64:
		if f.Data != elf.ELFDATA2LSB {
			return ArchUnknown, fmt.Errorf("%w: big-endian ppc64", ErrUnsupportedArch)
		}
		return ArchPPC64LE, nil
	}
	return ArchUnknown, fmt.Errorf("%w: ELF machine %s", ErrUnsupportedArch, f.Machine)
}

// HostArch returns the Arch of the machine this program runs on, or
// ArchUnknown. Attaching needs the binary's Arch to equal it, because the
// register offsets in a Spec are those of the kernel's struct pt_regs.
func HostArch() Arch {
	a, err := archOf(&elf.File{FileHeader: elf.FileHeader{Class: elf.ELFCLASS64, Data: elf.ELFDATA2LSB, Machine: hostarch.Machine}})
	if err != nil {
		return ArchUnknown
	}
	return a
}

// A register as the BPF side sees it: its name and the byte offset of its
// slot in the kernel's struct pt_regs for the architecture.
type register struct {
	name  string // canonical (widest) name
	off   int16  // offset in struct pt_regs
	width int    // bytes named by the spelling that was parsed
}

// x86-64 struct pt_regs (arch/x86/include/asm/ptrace.h): r15 r14 r13 r12
// bp bx r11 r10 r9 r8 ax cx dx si di orig_ax ip cs flags sp ss, 8 bytes each.
var x86Slots = map[string]int16{
	"r15": 0, "r14": 8, "r13": 16, "r12": 24, "rbp": 32, "rbx": 40,
	"r11": 48, "r10": 56, "r9": 64, "r8": 72, "rax": 80, "rcx": 88,
	"rdx": 96, "rsi": 104, "rdi": 112, "rip": 128, "rsp": 152,
}

// x86Regs maps every spelling of a general-purpose register (64, 32, 16
// and low 8 bits) to its slot. The high-byte registers (%ah...) are left
// out on purpose: their value is not the low bits of a slot. Built on
// first use, not at start-up: a program that never decodes an x86
// argument (multiprobe list) does not pay for its hundred entries.
var x86Regs = sync.OnceValue(func() map[string]register {
	m := make(map[string]register)
	add := func(name, full string, width int) {
		m[name] = register{name: full, off: x86Slots[full], width: width}
	}
	for _, r := range []string{"ax", "bx", "cx", "dx"} {
		add("r"+r, "r"+r, 8)
		add("e"+r, "r"+r, 4)
		add(r, "r"+r, 2)
		add(r[:1]+"l", "r"+r, 1)
	}
	for _, r := range []string{"si", "di", "bp", "sp"} {
		add("r"+r, "r"+r, 8)
		add("e"+r, "r"+r, 4)
		add(r, "r"+r, 2)
		add(r+"l", "r"+r, 1)
	}
	for i := 8; i <= 15; i++ {
		r := "r" + strconv.Itoa(i)
		add(r, r, 8)
		add(r+"d", r, 4)
		add(r+"w", r, 2)
		add(r+"b", r, 1)
		add(r+"l", r, 1)
	}
	add("rip", "rip", 8)
	add("eip", "rip", 4)
	return m
})

// arm64: struct user_pt_regs { u64 regs[31]; u64 sp; u64 pc; u64 pstate; }
// sits at the start of the kernel's struct pt_regs.
func arm64Reg(name string) (register, bool) {
	switch name {
	case "sp":
		return register{"sp", 31 * 8, 8}, true
	case "wsp":
		return register{"sp", 31 * 8, 4}, true
	}
	if len(name) < 2 || (name[0] != 'x' && name[0] != 'w') {
		return register{}, false
	}
	n, ok := regNum(name[1:], 30)
	if !ok {
		return register{}, false
	}
	width := 8
	if name[0] == 'w' {
		width = 4
	}
	return register{"x" + name[1:], int16(n * 8), width}, true
}

// riscv64 struct pt_regs: epc, then x1..x31 (ra sp gp tp t0-t2 s0 s1 a0-a7
// s2-s11 t3-t6), so xN lives at N*8. x0 is hard-wired zero and has no slot.
var riscvABINames = [...]string{
	"zero", "ra", "sp", "gp", "tp", "t0", "t1", "t2", "s0", "s1",
	"a0", "a1", "a2", "a3", "a4", "a5", "a6", "a7",
	"s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9", "s10", "s11",
	"t3", "t4", "t5", "t6",
}

func riscvReg(name string) (register, bool) {
	if name == "fp" {
		name = "s0"
	}
	for i, n := range riscvABINames {
		if n == name && i != 0 {
			return register{n, int16(i * 8), 8}, true
		}
	}
	if len(name) >= 2 && name[0] == 'x' {
		if n, ok := regNum(name[1:], 31); ok && n != 0 {
			return register{riscvABINames[n], int16(n * 8), 8}, true
		}
	}
	return register{}, false
}

// s390x struct pt_regs starts with user_pt_regs { args[1]; psw_t psw (16
// bytes); gprs[16]; }, so %rN lives at 24 + N*8.
func s390Reg(name string) (register, bool) {
	if !strings.HasPrefix(name, "%r") {
		return register{}, false
	}
	n, ok := regNum(name[2:], 15)
	if !ok {
		return register{}, false
	}
	return register{"r" + name[2:], int16(24 + n*8), 8}, true
}

// ppc64 struct pt_regs starts with gpr[32]. GCC prints registers as bare
// numbers unless -mregnames is given, then as %rN.
func ppcReg(name string) (register, bool) {
	name = strings.TrimPrefix(strings.TrimPrefix(name, "%"), "r")
	n, ok := regNum(name, 31)
	if !ok {
		return register{}, false
	}
	return register{"r" + name, int16(n * 8), 8}, true
}

// regNum parses a decimal register number without sign or leading zeros.
func regNum(s string, max int) (int, bool) {
	if s == "" || len(s) > 2 || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
		n = n*10 + int(s[i]-'0')
	}
	return n, n <= max
}

// ipOffset is the pt_regs offset of the instruction pointer, which at a
// uprobe holds the probed address.
func ipOffset(a Arch) int16 {
	switch a {
	case ArchX86_64:
		return 128
	case ArchARM64:
		return 32 * 8 // pc
	case ArchRISCV64:
		return 0 // epc
	case ArchS390X:
		return 16 // psw.addr
	case ArchPPC64LE:
		return 32 * 8 // nip
	}
	return -1
}
