package kernelprobe_test

import (
	"debug/elf"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/multiprobe/multiprobe/kernelprobe"
)

// TestCheckInsn checks the predictor on instructions of each of the
// kernel's rules, and on common function entries it accepts. The whole
// rule set is checked against the kernel itself by
// TestPredictorAgreesWithKernel, in package multiprobe.
func TestCheckInsn(t *testing.T) {
	for _, tc := range []struct {
		machine elf.Machine
		code    string // hex, little-endian words on arm64
		refused string // a word of the reason, "" if accepted
	}{
		{elf.EM_X86_64, "55", ""},                     // push %rbp
		{elf.EM_X86_64, "f30f1efa", ""},               // endbr64
		{elf.EM_X86_64, "4157", ""},                   // push %r15
		{elf.EM_X86_64, "0f05", ""},                   // syscall
		{elf.EM_X86_64, "6690", ""},                   // xchg %ax,%ax, a nop
		{elf.EM_X86_64, "c4e27d78c6", ""},             // vpbroadcastb %xmm6,%ymm0
		{elf.EM_X86_64, "c5f877", ""},                 // vzeroupper
		{elf.EM_X86_64, "f2e900000000", ""},           // bnd jmp
		{elf.EM_X86_64, "f0ff0f", "lock prefix"},      // lock decl (%rdi)
		{elf.EM_X86_64, "3effe0", "segment prefix"},   // notrack jmp *%rax
		{elf.EM_X86_64, "64488b042528000000", ""},     // mov %fs:0x28,%rax
		{elf.EM_X86_64, "c5fe6f06", "VEX"},            // vmovdqu (%rsi),%ymm0
		{elf.EM_X86_64, "c5f96ec6", "VEX"},            // vmovd %esi,%xmm0
		{elf.EM_X86_64, "62f1fe286f06", "EVEX"},       // vmovdqu64 (%rsi),%ymm0
		{elf.EM_X86_64, "66e80000", "operand-size"},   // callw
		{elf.EM_X86_64, "660f840000", "operand-size"}, // je with 0x66
		{elf.EM_X86_64, "cc", "int3"},                 // int3
		{elf.EM_X86_64, "8ed0", "%ss"},                // mov %eax,%ss
		{elf.EM_X86_64, "ec", "port I/O"},             // in (%dx),%al
		{elf.EM_X86_64, "", "decode"},                 // nothing
		{elf.EM_X86_64, "666666", "decode"},           // prefixes only
		{elf.EM_AARCH64, "3f2303d5", ""},              // paciasp
		{elf.EM_AARCH64, "5f2403d5", ""},              // bti c
		{elf.EM_AARCH64, "fd7bbfa9", ""},              // stp x29, x30, [sp, #-16]!
		{elf.EM_AARCH64, "00000014", ""},              // b .
		{elf.EM_AARCH64, "c0035fd6", ""},              // ret
		{elf.EM_AARCH64, "20423bd5", "DAIF"},          // mrs x0, daif
		{elf.EM_AARCH64, "010000d4", "exception"},     // svc #0
		{elf.EM_AARCH64, "007c5f88", "exclusive"},     // ldxr w0, [x0]
		{elf.EM_AARCH64, "ff0b5fd6", "authenticated"}, // retaa
		{elf.EM_AARCH64, "40d03bd5", ""},              // mrs x0, tpidr_el0
		{elf.EM_AARCH64, "3f2003d5", "hint"},          // yield
		{elf.EM_AARCH64, "00", "decode"},
		{elf.EM_RISCV, "00", ""}, // rules unknown: accepted
	} {
		code, err := hex.DecodeString(tc.code)
		if err != nil {
			t.Fatal(err)
		}
		err = kernelprobe.CheckInsn(tc.machine, code)
		switch {
		case tc.refused == "" && err != nil:
			t.Errorf("%v %s: %v, want accepted", tc.machine, tc.code, err)
		case tc.refused != "" && (err == nil || !strings.Contains(err.Error(), tc.refused)):
			t.Errorf("%v %s: %v, want refused for %q", tc.machine, tc.code, err, tc.refused)
		case err != nil && !errors.Is(err, kernelprobe.ErrUnprobeable):
			t.Errorf("%v %s: %v does not wrap ErrUnprobeable", tc.machine, tc.code, err)
		default:
			t.Logf("%v %s: %v", tc.machine, tc.code, err)
		}
	}
}

// FuzzCheckInsn feeds the predictor any bytes, as a hostile binary's code
// would be: it never panics, and what it refuses wraps ErrUnprobeable.
func FuzzCheckInsn(f *testing.F) {
	for _, seed := range []string{"f0ff0f", "c5fe6f06", "62f1fe286f06", "c4e3f96bc210", "660f840000", "3f2303d5", "ff0b5fd6", ""} {
		b, _ := hex.DecodeString(seed)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, code []byte) {
		for _, m := range []elf.Machine{elf.EM_X86_64, elf.EM_AARCH64} {
			if err := kernelprobe.CheckInsn(m, code); err != nil && !errors.Is(err, kernelprobe.ErrUnprobeable) {
				t.Fatalf("%v % x: %v does not wrap ErrUnprobeable", m, code, err)
			}
		}
	})
}
