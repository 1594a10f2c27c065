// Package pidfilter restricts BPF programs to a set of processes from
// inside BPF, without changing their source.
//
// The kernel's own filters fall short: a perf-event uprobe's pid selects a
// single thread, uprobe_multi's pid filter missed every thread but one
// before Linux 6.10, and neither takes more than one process. [Inject]
// rewrites a collection spec before it is loaded so that each chosen
// program starts with a short prologue: it looks the current process's pid
// (bpf_get_current_pid_tgid() >> 32, the tgid) and then [AllPIDs] up in a
// hash map ([MapName]) and returns 0 when both are absent; otherwise it
// restores the
// context register and falls through to the program, whose behaviour is
// unchanged. The program's entry symbol and BTF function and line
// information move to the prologue, so programs with bpf-to-bpf calls,
// global functions and tail calls still pass the verifier.
//
// After loading, a [Filter] changes the set while the program stays
// attached: [Filter.Acquire], [Filter.Release], [Filter.Replace],
// [Filter.PIDs]. Each pid is reference-counted, so that several holders
// (attachments of one program with overlapping pid sets) share the map
// and a pid leaves only with its last holder. The set starts empty, so a
// filtered program does nothing until a pid is acquired. The cost is one
// helper call and one hash lookup per event of a wanted process, two for
// the others.
package pidfilter
