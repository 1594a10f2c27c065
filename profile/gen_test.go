package profile

// The test program's object is committed, like the meter's.
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target bpfel,bpfeb -cflags "-O2 -g -Wall -Werror -I../bpf" hot testdata/hot.bpf.c
