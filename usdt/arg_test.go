package usdt

import (
	"errors"
	"strings"
	"testing"
)

func TestParseArgs(t *testing.T) {
	reg := func(size int, signed bool, name string, off int16) Arg {
		return Arg{Size: size, Signed: signed, Kind: ArgReg, Reg: name, RegOffset: off, IndexOffset: -1}
	}
	con := func(size int, signed bool, v int64) Arg {
		return Arg{Size: size, Signed: signed, Kind: ArgConst, Value: v, RegOffset: -1, IndexOffset: -1}
	}
	mem := func(size int, signed bool, name string, off int16, v int64) Arg {
		return Arg{Size: size, Signed: signed, Kind: ArgMem, Reg: name, RegOffset: off, Value: v, IndexOffset: -1}
	}
	sib := func(size int, signed bool, base string, boff int16, idx string, ioff int16, scale uint8, v int64) Arg {
		return Arg{Size: size, Signed: signed, Kind: ArgSIB, Reg: base, RegOffset: boff, Index: idx, IndexOffset: ioff, Scale: scale, Value: v}
	}
	for _, c := range []struct {
		arch Arch
		in   string
		want []Arg
	}{
		{ArchX86_64, "", nil},
		{ArchX86_64, "8@%rdi", []Arg{reg(8, false, "rdi", 112)}},
		{ArchX86_64, "-4@%eax -2@%cx 1@%sil -1@%r8b 2@%r15w 4@%r9d 8@%rsp 8@%rip",
			[]Arg{reg(4, true, "rax", 80), reg(2, true, "rcx", 88), reg(1, false, "rsi", 104), reg(1, true, "r8", 72),
				reg(2, false, "r15", 0), reg(4, false, "r9", 64), reg(8, false, "rsp", 152), reg(8, false, "rip", 128)}},
		{ArchX86_64, "-1@$-5 8@$0x10 4@$-294967296", []Arg{con(1, true, -5), con(8, false, 16), con(4, false, -294967296)}},
		{ArchX86_64, "-4@112(%rsp) 8@-80(%rbx) -8@(%rdi)",
			[]Arg{mem(4, true, "rsp", 152, 112), mem(8, false, "rbx", 40, -80), mem(8, true, "rdi", 112, 0)}},
		{ArchX86_64, "-4@(%rdi,%rsi,4) 8@16(%rax,%rbx,8) 2@(%rcx,%rdx) 1@-3(,%r12,2) 4@(%rax,%rbx,)",
			[]Arg{sib(4, true, "rdi", 112, "rsi", 104, 4, 0), sib(8, false, "rax", 80, "rbx", 40, 8, 16),
				sib(2, false, "rcx", 88, "rdx", 96, 1, 0), sib(1, false, "", -1, "r12", 24, 2, -3),
				sib(4, false, "rax", 80, "rbx", 40, 1, 0)}},
		{ArchX86_64, "4@0x601040", []Arg{mem(4, false, "", -1, 0x601040)}},
		{ArchX86_64, "8@%rbp 8@%r12 -4@%eax", []Arg{reg(8, false, "rbp", 32), reg(8, false, "r12", 24), reg(4, true, "rax", 80)}},
		{ArchARM64, "8@x0 -4@w1 8@sp 8@x30", []Arg{reg(8, false, "x0", 0), reg(4, true, "x1", 8), reg(8, false, "sp", 248), reg(8, false, "x30", 240)}},
		{ArchARM64, "8@[x29] -4@[sp, 16] 2@[x2, #-8] 8@[x1,8] 4@[x0, x1]",
			[]Arg{mem(8, false, "x29", 232, 0), mem(4, true, "sp", 248, 16), mem(2, false, "x2", 16, -8), mem(8, false, "x1", 8, 8),
				sib(4, false, "x0", 0, "x1", 8, 1, 0)}},
		{ArchARM64, "-4@-5 8@#42", []Arg{con(4, true, -5), con(8, false, 42)}},
		{ArchRISCV64, "8@a0 -4@s0 8@x5 8@fp", []Arg{reg(8, false, "a0", 80), reg(4, true, "s0", 64), reg(8, false, "t0", 40), reg(8, false, "s0", 64)}},
		{ArchRISCV64, "8@16(sp) -4@-20(s0) 4@7", []Arg{mem(8, false, "sp", 16, 16), mem(4, true, "s0", 64, -20), con(4, false, 7)}},
		{ArchS390X, "8@%r2 -4@160(%r15) 4@-3 8@8(%r1,%r2)",
			[]Arg{reg(8, false, "r2", 40), mem(4, true, "r15", 144, 160), con(4, false, -3), sib(8, false, "r2", 40, "r1", 32, 1, 8)}},
		{ArchPPC64LE, "8@3 -4@%r4 8@r31 4@i5 -8@-16(31) 8@24(%r1) 4@9,10",
			[]Arg{reg(8, false, "r3", 24), reg(4, true, "r4", 32), reg(8, false, "r31", 248), con(4, false, 5),
				mem(8, true, "r31", 248, -16), mem(8, false, "r1", 8, 24), sib(4, false, "r9", 72, "r10", 80, 1, 0)}},
	} {
		got, err := ParseArgs(c.arch, c.in)
		if err != nil {
			t.Errorf("%s %q: %v", c.arch, c.in, err)
			continue
		}
		if len(got) != len(c.want) {
			t.Errorf("%s %q: %d args, want %d", c.arch, c.in, len(got), len(c.want))
			continue
		}
		for i := range got {
			w := c.want[i]
			w.Spec = got[i].Spec
			if got[i] != w {
				t.Errorf("%s %q arg %d:\n got %+v\nwant %+v", c.arch, c.in, i, got[i], w)
			}
		}
		// Spec must be the argument's own text.
		if strings.Join(specs(got), " ") != strings.Join(strings.Fields(strings.ReplaceAll(c.in, ", ", ",")), " ") &&
			c.arch != ArchARM64 {
			t.Errorf("%s %q: specs %q", c.arch, c.in, specs(got))
		}
	}
}

func specs(args []Arg) []string {
	var s []string
	for _, a := range args {
		s = append(s, a.Spec)
	}
	return s
}

// TestRISCVLo checks the %lo(symbol) operand of a RISC-V non-PIE binary:
// the low 12 bits of the symbol's address, sign-extended, since lui
// rounded the upper part up when bit 11 is set.
func TestRISCVLo(t *testing.T) {
	syms := map[string]uint64{"low": 0x12345, "high": 0x12fff, "mid": 0x12800}
	p := argParser{arch: ArchRISCV64, resolve: func(n string) (uint64, bool) { v, ok := syms[n]; return v, ok }}
	for in, want := range map[string]int64{
		"-4@%lo(low)(a5)": 0x345, "-4@%lo(high)(a5)": -1, "-4@%lo(mid)(a5)": -0x800, "8@%lo(low+4)(a0)": 0x349,
	} {
		args, err := p.parse(in)
		if err != nil {
			t.Errorf("%q: %v", in, err)
			continue
		}
		if a := args[0]; a.Kind != ArgMem || a.Value != want || a.RegOffset < 0 {
			t.Errorf("%q: %+v, want a memory operand at base%+d", in, a, want)
		}
	}
}

func TestParseArgsErrors(t *testing.T) {
	for _, c := range []struct {
		arch Arch
		in   string
	}{
		{ArchX86_64, "%rax"},              // no size
		{ArchX86_64, "3@%rax"},            // bad size
		{ArchX86_64, "16@%rax"},           // bad size
		{ArchX86_64, "x@%rax"},            // bad size
		{ArchX86_64, "8@"},                // no location
		{ArchX86_64, "8@%ah"},             // high byte register
		{ArchX86_64, "8@%xmm0"},           // not a GPR
		{ArchX86_64, "8@$abc"},            // bad immediate
		{ArchX86_64, "8@8(%rax"},          // unbalanced
		{ArchX86_64, "8@()"},              // empty
		{ArchX86_64, "8@(%rax,%rsp,2)"},   // %rsp as index
		{ArchX86_64, "8@(%rax,%rbx,3)"},   // bad scale
		{ArchX86_64, "8@(%rax,%rbx,2,1)"}, // too many parts
		{ArchX86_64, "8@sym(%rip)"},       // symbol without a symbol table
		{ArchX86_64, "8@4(%rip,%rax,1)"},  // %rip with index
		{ArchX86_64, "8@!!(%rax)"},        // bad displacement
		{ArchX86_64, strings.Repeat("8@%rax ", 13)},
		{ArchARM64, "8@x31"},
		{ArchARM64, "8@[x0, y]"},
		{ArchARM64, "8@[q0]"},
		{ArchARM64, "8@[x0"},
		{ArchRISCV64, "8@zero"},
		{ArchRISCV64, "8@x32"},
		{ArchRISCV64, "-4@%lo(sym)(a5)"}, // symbol without a symbol table
		{ArchRISCV64, "-4@%lo(sym)"},     // no base register
		{ArchRISCV64, "-4@%lo(sym(a5)"},  // unbalanced
		{ArchS390X, "8@%r16"},
		{ArchS390X, "8@(%r1,%q)"},
		{ArchPPC64LE, "8@32"},
		{ArchPPC64LE, "8@ix"},
		{ArchUnknown, "8@%rax"},
	} {
		_, err := ParseArgs(c.arch, c.in)
		if err == nil {
			t.Errorf("%s %q: no error", c.arch, c.in)
			continue
		}
		if c.arch == ArchUnknown {
			if !errors.Is(err, ErrUnsupportedArch) {
				t.Errorf("%s %q: %v is not ErrUnsupportedArch", c.arch, c.in, err)
			}
			continue
		}
		if !errors.Is(err, ErrBadArgSpec) {
			t.Errorf("%s %q: %v is not ErrBadArgSpec", c.arch, c.in, err)
		}
	}
}

func TestArgString(t *testing.T) {
	args, err := ParseArgs(ArchX86_64, "-4@-8(%rbp) 8@$3 1@%al 4@16(%rax,%rbx,4) 2@(,%rcx,2)")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"s32 *(rbp-8)", "u64 3", "u8 rax", "u32 *(rax+rbx*4+0x10)", "u16 *(rcx*2)"}
	for i, a := range args {
		if a.String() != want[i] {
			t.Errorf("%q: %q, want %q", a.Spec, a.String(), want[i])
		}
	}
}
