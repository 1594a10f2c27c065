package ifunc

import (
	"debug/elf"
	"testing"
)

func TestEntry(t *testing.T) {
	for _, c := range []struct {
		name string
		code []byte
		skip int
	}{
		// vmovd %esi,%xmm0; mov %edi,%eax; ret: how __strchr_avx2 starts.
		{"vex to a vector register", []byte{0xc5, 0xf9, 0x6e, 0xc6, 0x89, 0xf8, 0xc3}, 4},
		// vpbroadcastb %esi,%ymm17 (EVEX); mov %edi,%eax; ret.
		{"evex to a vector register", []byte{0x62, 0xe2, 0x7d, 0x28, 0x7a, 0xce, 0x89, 0xf8, 0xc3}, 6},
		// vmovdqu %ymm0,(%rdi): writes memory, so it must run under the probe.
		{"vex to memory", []byte{0xc5, 0xfe, 0x7f, 0x07, 0xc3}, 0},
		// mov %edi,%eax first: the kernel takes it.
		{"not vex", []byte{0x89, 0xf8, 0xc3}, 0},
		// vmovd %esi,%xmm0; L: dec %edi; jnz L: the loop re-enters the
		// second instruction, where a probe would count each turn.
		{"second instruction a jump target", []byte{0xc5, 0xf9, 0x6e, 0xc6, 0xff, 0xcf, 0x75, 0xfc, 0xc3}, 0},
		{"empty", nil, 0},
	} {
		skip, why := Entry(elf.EM_X86_64, c.code)
		if skip != c.skip || (skip > 0) != (why != "") {
			t.Errorf("%s: skip %d (%q), want %d", c.name, skip, why, c.skip)
		}
	}
	if skip, _ := Entry(elf.EM_AARCH64, []byte{0xc5, 0xf9, 0x6e, 0xc6}); skip != 0 {
		t.Errorf("arm64: skip %d", skip)
	}
}
