// Package x86dec decodes x86-64 instructions with golang.org/x/arch's
// x86asm, safely for any bytes: the decoder indexes past the end of some
// truncated VEX instructions (x/arch v0.30; kernelprobe's FuzzCheckInsn
// found it with "c5 30"), and code read from a hostile or truncated file
// must not crash multiprobe. elfsym (Go stack checks), ifunc (IFUNC
// implementations' first instructions) and kernelprobe (the kernel's
// uprobe rules) share it.
package x86dec

import (
	"errors"

	"golang.org/x/arch/x86/x86asm"
)

// ErrTruncated is returned where the decoder failed on code that ends
// inside an instruction.
var ErrTruncated = errors.New("x86dec: truncated instruction")

// Decode decodes the 64-bit mode instruction at the start of code.
func Decode(code []byte) (inst x86asm.Inst, err error) {
	defer func() {
		if recover() != nil {
			inst, err = x86asm.Inst{}, ErrTruncated
		}
	}()
	return x86asm.Decode(code, 64)
}
