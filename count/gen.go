package count

// The counter object is committed; regenerate it with `go generate
// ./count` (clang-19 from Debian). The output is reproducible byte for
// byte, which .ci/check-generate verifies.
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target bpfel,bpfeb -cflags "-O2 -g -Wall -Werror -I../bpf" counter bpf/count.c
