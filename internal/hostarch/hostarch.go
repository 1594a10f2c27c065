// Package hostarch names the machine this program runs on as ELF files
// name machines, once for the packages that compare a binary with it:
// elfsym (which libraries a bare name may mean), ifunc (whose resolvers
// can run here) and usdt (whose register offsets the kernel's pt_regs
// has).
package hostarch

import (
	"debug/elf"
	"runtime"
)

// Machine is the host's ELF machine among those multiprobe reads binaries
// of: EM_X86_64, EM_AARCH64, EM_RISCV, EM_S390 and EM_PPC64 (little-endian);
// EM_NONE on any other.
var Machine = machine(runtime.GOARCH)

func machine(goarch string) elf.Machine {
	switch goarch {
	case "amd64":
		return elf.EM_X86_64
	case "arm64":
		return elf.EM_AARCH64
	case "riscv64":
		return elf.EM_RISCV
	case "s390x":
		return elf.EM_S390
	case "ppc64le":
		return elf.EM_PPC64
	}
	return elf.EM_NONE
}
