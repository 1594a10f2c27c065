// Package attach attaches one BPF program to many user-space sites through
// uprobe_multi links (Linux 6.6+): one link, and one file descriptor, per
// binary, however many sites it has.
//
// Sites are file offsets into a binary (package elfsym turns symbols into
// offsets). Each site carries a BPF cookie, which the program reads with
// bpf_get_attach_cookie() to tell sites apart, and optionally a ref-counter
// offset (a USDT semaphore). [UprobeMulti] creates the links all or
// nothing: if one binary fails, the links already made are closed and the
// error names the binary, the kernel's errno and what to do about it.
//
// The program must have been loaded for the uprobe_multi path (see
// kernelprobe.PrepareProgramSpec); kernels without uprobe_multi need the
// per-site perf-event path of package fallback instead.
package attach
