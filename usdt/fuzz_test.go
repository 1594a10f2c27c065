package usdt

import (
	"encoding/binary"
	"errors"
	"testing"
)

func FuzzParseNotes(f *testing.F) {
	le := binary.LittleEndian
	good := le.AppendUint32(nil, 8)
	good = le.AppendUint32(good, uint32(24+len("p\x00n\x008@%rdi\x00")))
	good = le.AppendUint32(good, 3)
	good = append(good, "stapsdt\x00"...)
	good = le.AppendUint64(good, 0x1139)
	good = le.AppendUint64(good, 0x2004)
	good = le.AppendUint64(good, 0x4010)
	good = append(good, "p\x00n\x008@%rdi\x00"...)
	f.Add(good, false)
	f.Add(good[:20], false)
	f.Add(append(good, good...), true)
	f.Fuzz(func(t *testing.T, data []byte, align8 bool) {
		align := uint64(4)
		if align8 {
			align = 8
		}
		notes, err := parseNotes(data, le, align)
		if err != nil {
			if !errors.Is(err, ErrMalformedNote) {
				t.Fatalf("error %v is not ErrMalformedNote", err)
			}
			return
		}
		for _, n := range notes {
			if n.provider == "" || n.name == "" {
				t.Fatalf("note with empty provider or name: %+v", n)
			}
		}
	})
}

func FuzzParseArgs(f *testing.F) {
	for _, s := range []struct {
		arch Arch
		spec string
	}{
		{ArchX86_64, "-4@%eax 8@-80(%rbx) -4@(%rdi,%rsi,4) 1@$-5 2@(,%rcx,2) 4@0x10"},
		{ArchX86_64, "8@sym+8(%rip)"},
		{ArchARM64, "8@x0 -4@[sp, 16] 8@[x1] 4@-3"},
		{ArchRISCV64, "8@a0 -4@-20(s0) 4@7"},
		{ArchS390X, "8@%r2 -4@160(%r15) 8@8(%r1,%r2)"},
		{ArchPPC64LE, "8@3 4@i5 -8@-16(31) 4@9,10"},
	} {
		f.Add(uint8(s.arch), s.spec)
	}
	f.Fuzz(func(t *testing.T, arch uint8, s string) {
		args, err := ParseArgs(Arch(arch), s)
		if err != nil {
			if !errors.Is(err, ErrBadArgSpec) && !errors.Is(err, ErrUnsupportedArch) {
				t.Fatalf("%q: error %v wraps no sentinel", s, err)
			}
			return
		}
		if len(args) > MaxArgs {
			t.Fatalf("%q: %d args", s, len(args))
		}
		for _, a := range args {
			_ = a.String()
			if a.Kind == ArgReg && a.RegOffset < 0 || a.Kind == ArgSIB && a.IndexOffset < 0 {
				t.Fatalf("%q: %+v lacks a register", s, a)
			}
		}
		// Everything ParseArgs accepts must encode.
		if _, err := NewSpec(args); err != nil {
			t.Fatalf("%q: parsed but NewSpec: %v", s, err)
		}
	})
}
