package profile

// The meter object is committed; regenerate it with `go generate
// ./profile`. The output is the same byte for byte on every run, which
// .ci/check-generate verifies.
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target bpfel,bpfeb -cflags "-O2 -g -Wall -Werror -I../bpf" runcost bpf/runcost.c
