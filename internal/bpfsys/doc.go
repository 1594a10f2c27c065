// Package bpfsys holds the raw bpf(2) calls that cilium/ebpf's public API does
// not offer in the form multiprobe needs: uprobe_multi and uprobe session
// link creation with the kernel's errno intact, uprobe_multi link info, and the
// memlock rlimit that kernels before 5.11 charge BPF memory to.
// kernelprobe uses them to probe features, attach to create links.
package bpfsys
