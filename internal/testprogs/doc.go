// Package testprogs builds what multiprobe's tests attach to and what they
// attach with.
//
// The target side is a generated C program (see [Target] and [BuildTarget]):
// n functions func_00000, func_00001, … that each return a known function of
// their argument ([ExpectedReturn]), every tenth with a second name made by
// __attribute__((alias)) ([HasAlias], [AliasName]), and a main that calls
// function i a known number of times ([ExpectedCalls]), optionally only after
// a line arrives on stdin so that a test can attach to a running process. The
// binary is compiled once per n and generator version with gcc and cached on
// disk, so even the 100,000-function target costs its build only once.
//
// The BPF side is compiled from the C sources under bpf/ by bpf2go with
// clang-19; the generated objects are committed and `go generate` reproduces
// them byte for byte. [LoadCounter] and [LoadSession] load them with the
// program specs prepared for a chosen attach path.
package testprogs
