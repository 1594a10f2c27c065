// Package load verifies the programs of a BPF collection concurrently.
//
// Starting an agent is dominated by the kernel verifier: BPF_PROG_LOAD blocks
// while the verifier explores a program's states, and every program verifies
// independently of the others. [Collection] and [Programs] therefore create
// the maps once, sequentially, and then load the programs on a bounded pool
// of goroutines (GOMAXPROCS by default), longest first (LPT scheduling), so
// that the phase approaches its lower bound max(longest program, total work /
// CPUs). Kernel BTF is parsed once for the whole phase and shared by every
// load; the memlock rlimit is raised once per process.
//
// Each job loads its own copy of its ProgramSpec; nothing shared is written
// while loads run. Every job records its own error, and failures are reported
// after all jobs finished, in job order, the first with its whole verifier
// log. On any failure every object the loader created is closed and nothing
// is returned but the [Profile], which records per program the verification
// wall time, the instructions the verifier processed, the worker and the
// start and end times, and for the phase the makespan, the total work and the
// lower bound.
//
// The static cost proxy, the instruction count, misranks programs whose
// verification cost follows a loop or branchy code rather than their size.
// A [CostCache] records measured costs per program and kernel release and
// orders the next start with them ([OrderCached]).
//
// For uprobe programs the expected attach type must be decided before the
// load (uprobe_multi or a perf-event uprobe); [Options.AttachType] is the hook
// through which the caller's decision reaches the loader, and programs that
// share a tail-call map must end up with one attach type.
package load
