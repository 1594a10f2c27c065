package x86dec

import (
	"errors"
	"testing"
)

func TestDecode(t *testing.T) {
	if inst, err := Decode([]byte{0x55}); err != nil || inst.Len != 1 {
		t.Errorf("push %%rbp: %v, %v", inst, err)
	}
	// A VEX prefix cut short, on which x86asm v0.30 panics.
	if _, err := Decode([]byte{0xc5, 0x30}); err == nil {
		t.Error("c5 30 decoded")
	} else if !errors.Is(err, ErrTruncated) {
		t.Logf("c5 30: %v (the decoder no longer panics)", err)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte{0xc5, 0x30})
	f.Add([]byte{0xf0, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, code []byte) { Decode(code) })
}
