package main

import (
	"fmt"
	"math"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// slots is bpf/agent.bpf.c's SLOTS: slot i of a histogram counts calls
// that took [2^i, 2^(i+1)) ns, the last also those that took longer.
const slots = 40

// collector reads the agent's maps at each scrape.
type collector struct {
	a                 *agent
	calls, dur, files *prometheus.Desc
	users             *prometheus.Desc
	byContainer       *prometheus.Desc
	overflow          *prometheus.Desc
}

func newCollector(a *agent) *collector {
	return &collector{
		a: a,
		calls: prometheus.NewDesc("multiprobe_calls_total", "Calls to a probed function, in every process and container of the node.",
			[]string{"probe", "function"}, nil),
		dur: prometheus.NewDesc("multiprobe_call_duration_seconds", "Time from a probed function's entry to its return.",
			[]string{"probe", "function"}, nil),
		files: prometheus.NewDesc("multiprobe_files", "Files attached: each distinct file the probes' targets match, as the kernel maps it.", nil, nil),
		// path alone is no file's name: a container's libc is at the
		// host's path, another file. file (device:inode, as
		// /proc/PID/maps writes it) tells them apart.
		users: prometheus.NewDesc("multiprobe_file_users", "Processes that map an attached file, by path and by the file the kernel maps (device:inode).", []string{"path", "file"}, nil),
		byContainer: prometheus.NewDesc("multiprobe_container_calls_total", "Calls to a probed function by container (\"\" for the node's own processes, \"other\" past the agent's limit of container and function pairs), with the container's pod.",
			[]string{"probe", "function", "container", "pod"}, nil),
		overflow: prometheus.NewDesc("multiprobe_container_overflow_calls_total", "Calls counted as container \"other\": the agent's table of container and function pairs was full.", nil, nil),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.calls
	ch <- c.dur
	ch <- c.files
	ch <- c.users
	ch <- c.byContainer
	ch <- c.overflow
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	for i, f := range c.a.functions() {
		if !c.a.names[f.probe] {
			continue // a function of a probe no longer in the config
		}
		var n uint64
		var h agentHist
		if c.a.objs.Counts.Lookup(uint32(i), &n) != nil || c.a.objs.Hists.Lookup(uint32(i), &h) != nil {
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.calls, prometheus.CounterValue, float64(n), f.probe, f.name)
		buckets := make(map[float64]uint64, slots-1)
		var count uint64
		for s := range slots {
			count += h.Slots[s]
			if s < slots-1 {
				buckets[math.Ldexp(1, s+1)/1e9] = count // le 2^(s+1) ns
			}
		}
		ch <- prometheus.MustNewConstHistogram(c.dur, count, float64(h.SumNs)/1e9, buckets, f.probe, f.name)
	}
	c.collectContainers(ch)
	files := c.a.w.Files()
	ch <- prometheus.MustNewConstMetric(c.files, prometheus.GaugeValue, float64(len(files)))
	for _, f := range files {
		if f.Users == 0 {
			continue // attached, waiting for a process: no series
		}
		id := fmt.Sprintf("%02x:%02x:%d", f.ID.Major, f.ID.Minor, f.ID.Inode)
		ch <- prometheus.MustNewConstMetric(c.users, prometheus.GaugeValue, float64(f.Users), f.Path, id)
	}
}

// handler serves /metrics, as OpenMetrics to a scraper that asks for it.
func (a *agent) handler() http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(newCollector(a))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{EnableOpenMetrics: true}))
	// The probes the DaemonSet's kubelet asks: alive while it serves,
	// and ready too, since it serves only once its watch has started
	// (what ran at the start attached, the pins taken back).
	ok := func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) }
	mux.HandleFunc("/healthz", ok)
	mux.HandleFunc("/readyz", ok)
	return mux
}

// collectContainers sends the calls by container, added up over the
// cgroups of one container (and over the node's own cgroups, container
// ""). The pairs of cgroups gone are deleted from the map, which keeps it
// to the containers that run: their calls stay in multiprobe_calls_total.
func (c *collector) collectContainers(ch chan<- prometheus.Metric) {
	fns := c.a.functions()
	type pair struct {
		k agentCgroupFn
		n uint64
	}
	var pairs []pair
	var ids []uint64
	seen := map[uint64]bool{}
	var k agentCgroupFn
	var n uint64
	it := c.a.objs.CgroupCounts.Iterate()
	for it.Next(&k, &n) {
		pairs = append(pairs, pair{k, n})
		if !seen[k.Cgroup] {
			seen[k.Cgroup] = true
			ids = append(ids, k.Cgroup)
		}
	}
	found, gone := c.a.cgroups.lookup(ids)
	isGone := map[uint64]bool{}
	for _, id := range gone {
		isGone[id] = true
	}
	type series struct {
		fn uint32
		c  container
	}
	sum := map[series]uint64{}
	for _, p := range pairs {
		if isGone[p.k.Cgroup] {
			c.a.objs.CgroupCounts.Delete(&p.k)
			continue
		}
		sum[series{p.k.Fn, found[p.k.Cgroup]}] += p.n
	}
	for i := range fns {
		var other uint64
		if c.a.objs.OtherCounts.Lookup(uint32(i), &other) == nil && other > 0 {
			sum[series{uint32(i), container{id: "other"}}] += other
		}
	}
	for s, n := range sum {
		if int(s.fn) >= len(fns) || !c.a.names[fns[s.fn].probe] {
			continue
		}
		f := fns[s.fn]
		ch <- prometheus.MustNewConstMetric(c.byContainer, prometheus.CounterValue, float64(n), f.probe, f.name, s.c.id, s.c.pod)
	}
	var over uint64
	c.a.objs.Overflow.Lookup(uint32(0), &over)
	ch <- prometheus.MustNewConstMetric(c.overflow, prometheus.CounterValue, float64(over))
}
