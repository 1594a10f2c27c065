// Package bpfsys holds the raw bpf(2) calls that cilium/ebpf's public API does
// not offer in the form multiprobe needs: uprobe_multi and uprobe session
// link creation with the kernel's errno intact, and uprobe_multi link info.
// kernelprobe uses them to probe features, attach to create links.
package bpfsys
