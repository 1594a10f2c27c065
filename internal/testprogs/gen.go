package testprogs

// The BPF objects are committed. Regenerate them with `go generate
// ./testprogs`; the output is the same byte for byte on every run (bpf2go
// maps the source directory out of the debug info, and the DWARF is
// stripped).
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target amd64,arm64,riscv64,s390x,ppc64le -cflags "-O2 -g -Wall -Werror -I../../bpf" counter bpf/counter.c
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target amd64,arm64,riscv64,s390x,ppc64le -cflags "-O2 -g -Wall -Werror -I../../bpf" session bpf/session.c
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target bpfel,bpfeb -cflags "-O2 -g -Wall -Werror -I../../bpf" usdtCounter bpf/usdt_counter.c
