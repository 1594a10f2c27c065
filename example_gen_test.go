package multiprobe_test

// A user's line reaches the headers through the module cache, as the
// README's main.go shows (TestReadmeGo runs it).
//
// This repository's own line uses relative paths, so that the committed
// objects rebuild byte for byte from any checkout.
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target bpfel,bpfeb -go-package multiprobe_test -cflags "-O2 -g -Wall -Werror -Ibpf" example testdata/example.bpf.c
