// Package multiprobe attaches one eBPF program to many user-space functions
// at once, from probe specs in bpftrace's syntax.
//
// A spec such as "uprobe:/bin/bash:sh_*,!sh_free*" or
// "uretprobe:libc.so.6:malloc" names a kind (entry or return), a target (a
// path, or a bare library or program name found like the dynamic loader
// would) and glob patterns over the target's function symbols. [Attach]
// resolves the specs to sites with package elfsym, asks package
// kernelprobe which attach path the running kernel supports, and attaches
// the program to every site through one uprobe_multi link per binary and
// kind (package attach). Each site gets a BPF cookie, its index in
// [Link.Sites], so a program can count per site in an array map. On that
// path Attach gives the kernel the sites' offsets as soon as they are known
// and builds the Sites on another CPU while the kernel installs the probes.
// Options.Session attaches uprobe sessions (Linux 6.13+) instead.
//
// Programs must be loaded for the chosen path: pass their specs through
// kernelprobe.PrepareProgramSpec (or PrepareCollectionSpec) before loading.
package multiprobe
