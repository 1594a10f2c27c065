// Package profile measures BPF programs where they run: what one run of a
// loaded program costs, as a mean and as percentiles, and which of its
// source lines the time goes to.
//
// A [Meter] attaches an fentry and an fexit program to the program it
// measures (any loaded program with BTF, such as one that bpf2go or
// ebpf.NewCollection loaded, found by *ebpf.Program, ID or pin) and times
// every run with the clock, and with the cycle and instruction counters
// where the machine has them: a VM without a PMU has none, and its
// [Counter]s say so rather than read zero. Durations go into a histogram
// of four slots per power of two, which the percentiles are read from.
//
// The meter's own part of each reading, the trampoline's work between its
// two clock readings, is measured once on an empty program by [Overhead]
// and reported beside the result, not subtracted from it. A run costs the
// measured program more than that: the fentry and fexit programs run too,
// about as long again, while a Meter is attached.
//
// A [Sampler] finds where a program spends its time: it samples every CPU
// with the kernel's cpu-clock event, keeps the samples whose instruction
// pointer is in the program's JIT image, and puts each on the source line
// the JIT compiled that code from, through the program's JIT line table
// and BTF line info. [Samples] are a table of lines, hottest first, a
// pprof profile ([Samples.WritePprof]: go tool pprof shows its top list,
// source view and flame graph) and folded stacks ([Samples.WriteFolded]).
//
// fentry and fexit on BPF programs need Linux 5.5 and a JIT; reading the
// counters from them needs the PMU's perf events. Sampling needs a JIT,
// BTF line info (Linux 5.0), and root, to read the JIT's addresses.
package profile
