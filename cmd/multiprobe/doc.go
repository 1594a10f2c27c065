// Command multiprobe lists the sites that glob patterns select in an ELF
// file, counts calls to them and times them through one uprobe_multi link,
// lists USDT probes, times a concurrent load of a BPF object, and profiles
// a loaded BPF program where it runs.
//
// Usage (multiprobe help COMMAND says more, with examples):
//
//	multiprobe list [--json] TARGET PATTERN...
//	multiprobe count [--pid PID | -v] [--duration D] [--json] [--stats] [--profile] PROBE... [-- CMD ARGS...]
//	multiprobe latency [--pid PID | -v] [--duration D] [--json] PROBE... [-- CMD ARGS...]
//	multiprobe usdt [--json] TARGET [PATTERN]
//	multiprobe load [--jobs N] [--order lpt|given|cached] [--json] OBJECT.o
//	multiprobe profile [--duration D] [--freq HZ] [--json] [-o FILE.pb.gz] [--folded FILE] PROG
//
// count and latency with neither a command nor --pid follow their probes'
// targets into every process and container of the machine as they appear
// (package watch): `multiprobe count -v --duration 10s 'uprobe:libc:malloc'`
// counts malloc in every libc, the host's and each container's own.
package main
