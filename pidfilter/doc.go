// Package pidfilter restricts BPF programs to a set of processes from
// inside BPF, without changing their source.
//
// The kernel's own filters fall short: a perf-event uprobe's pid selects a
// single thread, uprobe_multi's pid filter missed every thread but one
// before Linux 6.10, and neither takes more than one process. [Inject]
// (or [InjectProgram] for one program spec) rewrites a spec before it is
// loaded so that each chosen program starts with a short prologue: it
// reads [AllMapName], an array of one value, and runs the program if
// every process is let through; otherwise it looks the current process's
// pid (bpf_get_current_pid_tgid() >> 32, the tgid) up in a hash
// ([MapName]) and returns 0 when it is absent. Then it restores the
// context register and falls through to the program, whose behaviour is
// unchanged. The program's entry symbol and BTF function and line
// information move to the prologue, so programs with bpf-to-bpf calls,
// global functions and tail calls still pass the verifier.
//
// After loading, a [Filter] changes the set while the program stays
// attached: [Filter.Acquire], [Filter.Release], [Filter.Replace],
// [Filter.PIDs]. Each pid is reference-counted, so that several holders
// may share the maps and a pid leaves only with its last holder; the root
// package gives every Link a filter of its own instead ([NewFilter]). The
// set starts empty, so a filtered program does nothing until a pid (or
// [AllPIDs]) is acquired.
//
// The cost per run (BenchmarkPIDFilter, Linux 6.18): while every process
// is let through, one array read that the verifier inlines, no helper call
// (about 2 ns); otherwise one helper call and one hash lookup (about 20 ns).
package pidfilter
