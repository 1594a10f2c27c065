// Command multiprobe lists the sites that glob patterns select in an ELF
// file, counts calls to them and times them through one uprobe_multi link,
// lists USDT probes, times a concurrent load of a BPF object, and profiles
// a loaded BPF program where it runs.
//
// Usage (multiprobe help COMMAND says more, with examples):
//
//	multiprobe list [--json] TARGET PATTERN...
//	multiprobe count [--pid PID] [--duration D] [--json] [--stats] [--profile] PROBE... [-- CMD ARGS...]
//	multiprobe latency [--pid PID] [--duration D] [--json] PROBE... [-- CMD ARGS...]
//	multiprobe usdt [--json] TARGET [PATTERN]
//	multiprobe load [--jobs N] [--order lpt|given|cached] [--json] OBJECT.o
//	multiprobe profile [--duration D] [--freq HZ] [--json] [-o FILE.pb.gz] [--folded FILE] PROG
package main
