package main

// The counter object is committed; regenerate it with `go generate
// ./cmd/multiprobe` (clang-19 from Debian). The output is reproducible byte
// for byte, which .ci/check-generate verifies.
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target amd64,arm64,riscv64,s390x,ppc64le -cflags "-O2 -g -Wall -Werror -I../../bpf" countArgs bpf/count_args.c
