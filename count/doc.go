// Package count counts the calls to probed sites with a BPF program of its
// own, so that a Go program gets bcc's funccount without writing BPF C or
// running clang: resolve the sites (multiprobe.Resolve), then
//
//	c, err := count.Attach(plan, nil)
//	...
//	defer c.Close()
//	snap, err := c.Snapshot()
//	for _, s := range snap.Sites {
//		fmt.Println(s.Site.Name, s.Calls)
//	}
//
// The program keeps one 64-bit count per site, indexed by the site's BPF
// cookie (multiprobe.Site.Cookie), and, with Options.By, a second table by
// site and by who made the call: the process (its pid, the tgid) or the
// cgroup (its cgroup v2 id, which names a container). The second table is
// bounded (Options.MaxBy): a call that finds it full is counted by site
// only, and a Snapshot says how many calls are not attributed.
//
// A Snapshot reads the counts while the program runs and counts: it may be
// taken at any time, from any goroutine (an agent's scrape), and is
// consistent per count, not across them. New loads the program without
// attaching it, for a caller that attaches it itself (Plan.Attach with a
// command it starts stopped, say); NewForWatch loads it for the plans of a
// package watch, whose sites take cookies from many plans, and Read counts
// the sites a watch's files report.
//
// The program runs on both attach paths (uprobe_multi, and per-site
// perf-event uprobes before Linux 6.6) and, through bpf/mp_cookie.bpf.h,
// on kernels without BPF cookies (before 5.15), where multiprobe gives
// each site a copy of it.
package count
