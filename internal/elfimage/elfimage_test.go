package elfimage

import (
	"debug/elf"
	"errors"
	"testing"
)

func TestOffsets(t *testing.T) {
	im := Load([]*elf.Prog{
		{ProgHeader: elf.ProgHeader{Type: elf.PT_PHDR, Vaddr: 0x40, Off: 0x40, Filesz: 0x200, Memsz: 0x200}},
		{ProgHeader: elf.ProgHeader{Type: elf.PT_LOAD, Flags: elf.PF_R, Vaddr: 0, Off: 0, Filesz: 0x800, Memsz: 0x800}},
		{ProgHeader: elf.ProgHeader{Type: elf.PT_LOAD, Flags: elf.PF_R | elf.PF_X, Vaddr: 0x1000, Off: 0x1000, Filesz: 0x500, Memsz: 0x500}},
		// Data whose address is not its offset, with a zero-filled tail.
		{ProgHeader: elf.ProgHeader{Type: elf.PT_LOAD, Flags: elf.PF_R | elf.PF_W, Vaddr: 0x3e10, Off: 0x2e10, Filesz: 0x100, Memsz: 0x300}},
	})
	if len(im) != 3 {
		t.Fatalf("%d segments, want the 3 PT_LOAD ones", len(im))
	}
	for _, tc := range []struct {
		vaddr uint64
		code  bool
		off   uint64
		ok    bool
	}{
		{0x1139, true, 0x1139, true},
		{0x1500, true, 0, false}, // past the code
		{0x0100, true, 0, false}, // in a non-executable segment
		{0x3e20, false, 0x2e20, true},
		{0x3f80, false, 0x2f80, true}, // the zero-filled tail
		{0x4110, false, 0, false},     // past the memory size
		{0x1139, false, 0, false},     // code where data is wanted
	} {
		off, err := im.Offset(tc.vaddr, tc.code)
		if (err == nil) != tc.ok || off != tc.off {
			t.Errorf("Offset(%#x, code %v) = %#x, %v; want %#x, ok %v", tc.vaddr, tc.code, off, err, tc.off, tc.ok)
		}
		if tc.code {
			if off, ok := im.Code(tc.vaddr); ok != tc.ok || off != tc.off {
				t.Errorf("Code(%#x) = %#x, %v; want %#x, %v", tc.vaddr, off, ok, tc.off, tc.ok)
			}
		}
	}
	if err := im.Within(0x2f10); err != nil {
		t.Errorf("Within the exact size: %v", err)
	}
	if err := im.Within(0x2f0f); !errors.Is(err, ErrTruncated) {
		t.Errorf("Within one byte short: %v, want ErrTruncated", err)
	}
}
