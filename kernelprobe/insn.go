package kernelprobe

import (
	"debug/elf"
	"errors"
	"fmt"
)

// ErrUnprobeable is wrapped by the error [CheckInsn] returns for an
// instruction the kernel will not place a uprobe at.
var ErrUnprobeable = errors.New("the kernel will not place a uprobe there")

// An InsnError says which instruction the kernel refuses to probe, and why.
type InsnError struct {
	// Insn is the instruction as a disassembler writes it ("lock decl
	// (%rdi)"), or its bytes where it does not decode.
	Insn string
	// Reason is the kernel's rule ("the kernel does not single-step an
	// instruction with a lock prefix").
	Reason string
}

func (e *InsnError) Error() string {
	return fmt.Sprintf("its instruction %s: %s", e.Insn, e.Reason)
}

// Unwrap returns ErrUnprobeable.
func (e *InsnError) Unwrap() error { return ErrUnprobeable }

// InsnWindow is how many bytes of code CheckInsn wants: the longest
// instruction of any architecture it knows (x86's 15 bytes, rounded up).
const InsnWindow = 16

// CheckInsn predicts whether the kernel places a uprobe at code, the bytes
// of a binary for machine from a site's offset on: nil if it will, an
// *InsnError wrapping ErrUnprobeable if it will not. The kernel decides
// when it first installs the probe in a process (arch_uprobe_analyze_insn):
// a link made while a process maps the file fails whole (ENOTSUPP on
// x86-64, EINVAL on arm64), and a probe installed as a process maps the
// file later is left out of that process without a word. Predicting it
// lets a glob leave such a site out and say so, instead of either.
//
// The rules are those of Linux 5.10 to 6.18, which agree on them; a
// machine whose rules CheckInsn does not know (neither x86-64 nor arm64)
// gets nil.
func CheckInsn(machine elf.Machine, code []byte) error {
	switch machine {
	case elf.EM_X86_64:
		return checkX86(code)
	case elf.EM_AARCH64:
		return checkARM64(code)
	}
	return nil
}
