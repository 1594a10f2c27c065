package main

// The BPF object is committed; `go generate` rebuilds it byte for byte.
// The headers come from multiprobe's bpf/ directory, here through the
// replace directive's path; in a module of your own, through
// $(go list -m -f '{{.Dir}}' github.com/multiprobe/multiprobe)/bpf.
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target amd64,arm64 -cflags "-O2 -g -Wall -Werror -I../../bpf" agent bpf/agent.bpf.c
