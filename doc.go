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
// kernelprobe's documentation. The four mechanisms below are explained
// here and only here; the code points back.
//
// # Sites and cookies
//
// Resolve numbers the sites once. Its rows are the plan's sites in order:
// the probes in the order given and, within one, by file offset. Sites at
// one file, kind and offset are one row, whatever reached them: a second
// probe (a glob and an exact name), or IFUNCs whose resolvers pick one
// implementation (memcpy and memmove). Attached twice, the program would
// run twice per call; the row carries every name instead (Site.Names).
// A site's row
// index is its cookie: its index in [Plan.Sites], the BPF cookie the kernel
// hands the program, and the key of a per-site map (all moved up by
// Options.CookieBase, for plans that share one program's maps). Everything that needs
// a site's number reads the rows, none counts on its own: the Sites, the
// targets handed to the kernel (offsets and cookies per binary), the USDT
// argument spec ids and the per-site path's messages. The kernel needs only
// offsets and cookies, so Attach never builds the Sites, whose names cost
// more than resolving the offsets did; an attach error then names uprobe
// sites by offset.
//
// # Pid filters
//
// A pid filter belongs to a [Link]. Where the kernel can filter
// (Options.PID alone, on a uprobe_multi link, Linux 6.10+), it does.
// Elsewhere (the perf-event path, uprobe_multi before 6.10, Options.PIDs: a
// set that [Link.SetPIDs] can change) the Link attaches its own copy of the
// program, with
// package pidfilter's prologue prepended and bound to maps of its own: two
// links, of one program or of two programs of one object, never see each
// other's pids, and a link without pids attaches the program as loaded.
// The copy costs one more verification per link; the prologue costs each
// run one array read while it admits every process, and one hash lookup
// otherwise.
//
// # USDT argument specs
//
// A USDT site's arguments are described by a spec (package usdt), which
// the program finds in its mp_usdt_specs map by an id carried in the
// site's kernel cookie beside the site's own cookie (bpf/mp_usdt.bpf.h).
// Ids are per map and reference-counted there: a Link takes one reference
// per distinct spec of its sites, shares an id with the map's other links
// where their specs are equal, and gives its references back on Close; an
// id is reused only after its last holder released it, and id 0 is never
// handed out, so that a stale site reads no arguments rather than another
// probe's.
//
// # Kernels without BPF cookies
//
// Before Linux 5.15 the kernel hands a program no cookie. A program that
// reads its cookie with mp_cookie (bpf/mp_cookie.bpf.h) is then loaded
// once per site, each copy with the site's cookie as a constant in a frozen
// read-only section, and the verifier prunes the helper call the old kernel
// lacks: exact for entry, return and USDT probes alike, as tracers told
// sites apart before cookies. [Plan.Prepare] marks the section; Attach
// loads the copies ([Link.NumClones]), which share every map of the program
// but the section. Every copy is verified again, so a plan of more than
// [MaxClones] sites is refused there.
//
// # Probes that outlive the agent
//
// [Link.Pin] pins what a Link holds in a directory of a BPF filesystem:
// its kernel links, the programs they run, its pid filter, the USDT spec
// map, and a manifest (a frozen BPF array, since a BPF filesystem holds
// nothing else) of its sites and of each binary's identity (device, inode,
// size, modification time, build ID). The probes then stay attached when
// the process exits or is killed, and [LoadPinnedLink] in the restarted
// process gives the Link back, with its sites and its pid set as the
// filter holds them. A pinned link holds the inode it was made on, so a
// binary replaced since (an upgrade) is probed no more in new processes:
// [Link.StaleFiles] says which. The kernel pins perf-event uprobes only as
// BPF perf links (Linux 5.15+). A pinned Link's Close releases this
// process's descriptors only; [Link.Unpin], then Close, detaches it.
//
// # Changing the probe set
//
// The kernel cannot change a uprobe link's sites. [Link.Update] therefore
// attaches the new set before it detaches the old, keeping the links of
// binaries whose sites stay as they are, and a site in both sets runs the
// program twice per call for a moment. With [Options.Updatable] each Link
// attaches a copy of the program with a generation check in front: outside
// an update it lets the current generation run (one array read); during
// one, the new copy, which the kernel runs first, tells the old one
// through a per-thread slot whether it counted the call, so that every
// call is counted once wherever the switch falls. A pinned Link stays
// pinned across an update: the new layout is pinned beside the old and
// the manifest replaced in one rename before the old pins go.
// [Link.SetPIDs] adds the new pids before it removes the old, so a pid in
// both sets is never filtered out.
package multiprobe
