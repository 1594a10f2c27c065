package pidfilter_test

// The BPF object is committed. Regenerate it with `go generate ./pidfilter`;
// the output is the same byte for byte on every run.
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target bpfel,bpfeb -go-package pidfilter_test -cflags "-O2 -g -Wall -Werror -I../bpf" filtered testdata/filtered.c
