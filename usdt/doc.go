// Package usdt finds USDT probes (<sys/sdt.h>, DTrace-style static probes)
// in ELF executables and shared libraries and describes their arguments
// for a BPF program.
//
// Open reads a file's .note.stapsdt notes: every note is one site of a
// provider:name probe, with its address (adjusted for prelink through
// .stapsdt.base), the file offset the kernel attaches to, the semaphore
// the kernel counts up while the probe is attached, and an argument string
// such as "-4@%edi 8@-16(%rbp)". The argument strings are decoded for the
// file's architecture (x86-64, arm64, riscv64, s390x and ppc64le), taken
// from its ELF header, so listing works on any host.
//
// The BPF side is bpf/mp_usdt.bpf.h. Each site's argument string becomes a
// Spec (the Go mirror of struct mp_usdt_spec) stored in the BPF array
// SpecMapName under an id that AcquireSpecs hands out and reference-counts
// in the map itself; the site's BPF cookie carries the id in its upper 32
// bits and the user's cookie in the lower 32 (PackCookie). Kernels without
// BPF cookies get the same value from mp_cookie.bpf.h's per-site program
// clones.
//
// This package resolves; attaching (uprobe_multi links, the per-site
// fallback, filling the maps) is done by the packages after it.
package usdt
