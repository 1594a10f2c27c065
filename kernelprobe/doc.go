// Package kernelprobe is multiprobe's "decide" stage: it finds out once per
// process what the running kernel offers for user-space probes and picks the
// attach path from it.
//
// [Detect] probes the kernel with tiny programs and link creations that must
// fail with a known errno (so nothing is ever attached), caches a conclusive
// result (an EPERM is none: the next call probes again), and returns it as a plain [Features] value. [Features.Path] chooses between
// one uprobe_multi link per binary ([PathUprobeMulti], Linux 6.6+) and
// per-site perf-event uprobes ([PathPerfEvent]). Because the kernel fixes a
// program's attach path when the program is loaded, the path must be decided
// before loading: [PrepareProgramSpec] and [PrepareCollectionSpec] set the
// expected attach type of uprobe programs to match.
//
// [CheckInsn] predicts the other thing the kernel decides for each site:
// whether it will place a uprobe at the instruction there at all (the
// rules of arch_uprobe_analyze_insn on x86-64 and arm64, proven against
// the kernel on whole libraries by the root package's tests).
//
// Tests and users can pretend the kernel lacks a feature, so that the
// fallback paths run on any kernel: programmatically with [SetOverride], or
// with the environment variable MULTIPROBE_FORCE, a comma-separated list of
//
//	fallback     no uprobe_multi links: use per-site perf-event uprobes
//	nopidfilter  uprobe_multi's pid filter is treated as broken (pre-6.10)
//	nocookie     no BPF cookies (pre-5.15, so the fallback path too)
//	norefctr     no ref-counter (USDT semaphore) offsets (pre-4.20)
//	nosession    no uprobe sessions (pre-6.13)
//
// An unknown word makes Detect return an error wrapping [ErrBadForce].
//
// # Version floors
//
// Every kernel version multiprobe's decisions rest on, in one place; other
// comments point here rather than repeat them. Each is detected, not read
// from the release string: distributions backport.
//
//	4.17  the "uprobe" perf PMU: perf-event uprobes without tracefs (UprobePMU)
//	4.20  ref-counter (USDT semaphore) offsets for perf-event uprobes (RefCtrOffset)
//	5.15  BPF cookies (bpf_get_attach_cookie) and BPF perf links (Cookies);
//	      before, each site gets its own copy of the program with the
//	      cookie built in (multiprobe.Link.NumClones)
//	6.6   uprobe_multi links: one link for many sites of a binary (UprobeMulti)
//	6.10  uprobe_multi's pid filter covers every thread of the process
//	      (commit 46ba0e49b642; UprobeMultiPIDFilter); before, and on the
//	      perf-event path, whose pid names one thread, pids are filtered
//	      inside BPF (package pidfilter)
//	6.12  every program in one PROG_ARRAY must share its expected attach
//	      type (package load probes for it, since stable kernels carry the
//	      rule back: Debian's 6.1 has it, its 5.10 not; it refuses or
//	      splits such maps)
//	6.13  uprobe sessions: one program at entry and return (UprobeSession)
package kernelprobe
