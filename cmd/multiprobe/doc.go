// Command multiprobe lists the sites that glob patterns select in an ELF
// file, counts calls to them through one uprobe_multi link, lists USDT probes
// and times a concurrent load of a BPF object.
//
// Usage (multiprobe help COMMAND says more, with examples):
//
//	multiprobe list [--json] TARGET PATTERN...
//	multiprobe count [--pid PID] [--duration D] [--json] [--stats] PROBE... [-- CMD ARGS...]
//	multiprobe usdt [--json] TARGET [PATTERN]
//	multiprobe load [--jobs N] [--order lpt|given|cached] [--json] OBJECT.o
package main
