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
package ifunc
