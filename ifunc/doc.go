// Package ifunc finds the function an IFUNC symbol stands for on this
// machine.
//
// An IFUNC (STT_GNU_IFUNC) symbol, as glibc's strlen, memcpy and most of its
// string functions are, points at a resolver: a function the dynamic loader
// calls once, at relocation, to choose an implementation for the CPU (an
// AVX2 strlen, an ERMS memcpy). A uprobe on the symbol's address fires once
// per process, not once per call. Resolve asks this machine's loader which
// implementation it picks: it starts a helper process (/bin/true, with the
// library preloaded) under ptrace, stops it at its entry point, once the
// loader has relocated everything, and calls each resolver there, as a
// debugger does, reading the implementation's address from the result
// register. The helper runs the library's constructors, as any program
// that loads it would, and is killed after. No cgo is needed.
//
// The resolvers and constructors are the library's code, so the helper
// runs them with no more rights than whoever could have written the file:
// started by root, it runs a user's library as that user, and a library
// others may write as nobody. It loads the file multiprobe opened and
// checked, through an inherited descriptor, not its path. A library in
// another process's root (/proc/PID/root/..., a container's) is not run
// on the host at all: ResolveIn reads what that process's own loader
// chose, from the GOT slots of the library's IRELATIVE relocations in the
// process's memory.
package ifunc
