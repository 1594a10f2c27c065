// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
#ifndef MULTIPROBE_TESTPROGS_REGS_H
#define MULTIPROBE_TESTPROGS_REGS_H

// A uprobe program's context is the kernel's struct pt_regs, whose layout
// differs per architecture. Only the return register is needed, so its
// offset is spelled out here rather than pulling in an architecture's
// <asm/ptrace.h>, which is not on the BPF target's include path. bpf2go
// defines __TARGET_ARCH_xxx from its -target list.
#if defined(__TARGET_ARCH_x86)
#define RETURN_REG_OFFSET (10 * 8) // ax, after r15 r14 r13 r12 bp bx r11 r10 r9 r8
#elif defined(__TARGET_ARCH_arm64)
#define RETURN_REG_OFFSET 0 // regs[0]
// The three below are the kernel's layouts (as package usdt tables them);
// no test VM runs these architectures, so only x86 and arm64 are known to
// work.
#elif defined(__TARGET_ARCH_riscv)
#define RETURN_REG_OFFSET (10 * 8) // a0 (x10), after epc ra sp gp tp t0-t2 s0 s1
#elif defined(__TARGET_ARCH_s390)
#define RETURN_REG_OFFSET (24 + 2 * 8) // gprs[2], after args[1] and psw
#elif defined(__TARGET_ARCH_powerpc)
#define RETURN_REG_OFFSET (3 * 8) // gpr[3]
#else
#error "testprogs: unsupported architecture (want x86, arm64, riscv, s390 or powerpc)"
#endif

static __always_inline __u64 return_value(void *ctx)
{
	return *(__u64 *)((char *)ctx + RETURN_REG_OFFSET);
}

#endif
