package multiprobe_test

// A user's line reaches the headers through the module cache:
//
//	//go:generate sh -c "go tool bpf2go -cflags \"-O2 -g -I$(go list -m -f '{{.Dir}}' github.com/multiprobe/multiprobe)/bpf\" example example.bpf.c"
//
// This repository's own line uses relative paths, so that the committed
// objects rebuild byte for byte from any checkout.
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target amd64,arm64 -go-package multiprobe_test -cflags "-O2 -g -Wall -Werror -Ibpf/include -Ibpf" example testdata/example.bpf.c
