package watch

// The BPF object is committed. Regenerate it with `go generate ./watch`;
// the output is the same byte for byte on every run.
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target amd64,arm64,riscv64,s390x,ppc64le -cflags "-O2 -g -Wall -Werror -I../bpf" events bpf/events.c
