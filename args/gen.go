package args

// The tracer objects are committed; regenerate them with `go generate
// ./args` (clang-19 from Debian). The output is reproducible byte for
// byte, which .ci/check-generate verifies. They are built for the
// architectures whose calling conventions args.c knows (other.go
// elsewhere).
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target amd64,arm64,riscv64,s390x,ppc64le -cflags "-O2 -g -Wall -Werror -I../bpf" tracer bpf/args.c
