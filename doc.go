// Package multiprobe attaches one eBPF program to many user-space functions
// and USDT probes at once, from probe specs in bpftrace's syntax.
//
// A spec such as "uprobe:/bin/bash:sh_*,!sh_free*",
// "uretprobe:libc.so.6:malloc" or "usdt:/usr/bin/python3:python:function__entry"
// names a kind (entry, return or USDT), a target (a path, or a bare library
// or program name found as the dynamic loader would) and glob patterns over
// the target's function symbols or USDT probes. A spec travels down one
// way:
//
//	probes, err := multiprobe.ParseProbes(specs...)     // text → []Probe, no I/O
//	plan, err := multiprobe.Resolve(probes, &opts)       // sites, kernel features, decisions
//	err = plan.Prepare(spec)                             // attach type, what copies need
//	// load spec: bpf2go LoadAndAssign, ebpf.NewCollection or package load
//	link, err := plan.Attach(prog)                       // one uprobe_multi link per binary, or per-site uprobes
//	defer link.Close()
//
// [Resolve] reads each binary once (packages elfsym and usdt) and keeps it
// open, so that [Plan.Attach] probes exactly the file that was resolved; it
// asks package kernelprobe what the running kernel offers and decides the
// attach path, the pid filter (the kernel's, or each Link's own in BPF) and
// how sites get their cookies. The plan is plain data: [Plan.Sites] lists
// the sites, whose index is the BPF cookie the program reads with
// bpf_get_attach_cookie, or on any kernel with mp_cookie from
// bpf/mp_cookie.bpf.h. [Plan.Prepare] readies the program's spec for the
// path before it is loaded. [Plan.Attach] finds the maps it needs in the
// loaded program itself, and attaches through one uprobe_multi link per
// binary and kind (package attach, Linux 6.6+) or one perf-event uprobe per
// site (package fallback); the [Link] owns what it made, and Close undoes
// exactly that. Options.Session attaches uprobe sessions instead.
//
// The kernel versions these decisions rest on are tabled once, in package
// kernelprobe's documentation.
package multiprobe
