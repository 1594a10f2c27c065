package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/multiprobe/multiprobe/internal/fds"

	"github.com/cilium/ebpf"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/load"
)

func init() {
	commands["load"] = &command{
		usage:      "[--jobs N] [--order lpt|given|cached] [--cost-cache FILE] [--json] OBJECT.o",
		short:      "load every program of a BPF object concurrently and profile the verifier (needs root)",
		privileges: "CAP_BPF and CAP_PERFMON",
		long: `Loads every program of the object the way package load does: kernel BTF
parsed once, programs verified in parallel, the costliest first (their costs
are remembered in the cost cache between runs), and prints, per program,
its verification time, instructions processed and a timeline of the
workers. Nothing stays loaded: the programs are closed before it exits.`,
		examples: []string{
			"load probes.bpf.o                    # verify all, costliest first",
			"load --jobs 1 --order given probes.bpf.o",
			"load --json probes.bpf.o | jq '.profile.programs[] | {name, verify_ns}'",
		},
		run: runLoad,
	}
}

// loadTimelineWidth is the number of columns of the per-worker timeline.
const loadTimelineWidth = 64

// loadKeys label programs in the timeline, by start order.
const loadKeys = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"

func runLoad(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("load")
	jobs := fs.Int("jobs", 0, "`N` programs verified at once (default GOMAXPROCS)")
	orderName := fs.String("order", "lpt", "`ORDER` of the loads: lpt (longest first), given or cached")
	costPath := fs.String("cost-cache", "", "cost cache `FILE` (default in the user's cache directory)")
	asJSON := fs.Bool("json", false, "print the profile as JSON")
	pos, _, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("need exactly one BPF object file")
	}
	if *jobs < 0 {
		return usagef("--jobs %d: want 0 (GOMAXPROCS) or more", *jobs)
	}
	order, err := load.ParseOrder(*orderName)
	if err != nil {
		return usagef("%v", err)
	}
	path := pos[0]

	obj, err := fds.OpenRegular(path)
	if err != nil {
		return fmt.Errorf("read BPF object: %w", err)
	}
	spec, err := ebpf.LoadCollectionSpecFromReader(obj)
	obj.Close()
	if err != nil {
		return fmt.Errorf("read BPF object %s: %w", path, err)
	}
	for _, note := range loadMapDefaults(spec) {
		fmt.Fprintf(stderr, "multiprobe load: %s\n", note)
	}

	opts := &load.Options{Jobs: *jobs, Order: order}
	// Uprobe programs load for the attach path this kernel supports, as
	// multiprobe count would attach them.
	if f, err := kernelprobe.Detect(); err == nil {
		p := f.Path()
		opts.AttachType = func(_ string, spec *ebpf.ProgramSpec) ebpf.AttachType {
			return kernelprobe.AttachType(spec, p)
		}
	}
	// Every run records measured costs, so that --order cached has them the
	// next time; a cache that cannot be opened only matters for that order.
	costs, err := load.OpenCostCache(*costPath)
	switch {
	case err == nil:
		opts.Costs = costs
	case order == load.OrderCached:
		return err
	case *costPath != "" && errors.Is(err, load.ErrUnsafeCostCache):
		// A path the user named that is a device, FIFO, link or in a
		// directory others control is a mistake to report, not to skip.
		return fmt.Errorf("--cost-cache: %w", err)
	default:
		fmt.Fprintf(stderr, "multiprobe load: not recording costs: %v\n", err)
	}

	coll, prof, loadErr := load.Collection(spec, opts)
	if coll != nil {
		coll.Close()
	}
	if prof == nil {
		return loadErr
	}
	if prof.CostCacheError != "" {
		fmt.Fprintf(stderr, "multiprobe load: %s\n", prof.CostCacheError)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(struct {
			Object  string        `json:"object"`
			Profile *load.Profile `json:"profile"`
		}{path, prof}); err != nil {
			return err
		}
	} else if err := writeLoadProfile(stdout, path, prof); err != nil {
		return err
	}
	// Failed programs do not spoil the profile of the others, but the
	// command still fails, with every failure and the first verifier log.
	return loadErr
}

// loadMapDefaults makes spec's maps creatable without the loader that
// would normally size them: zero max_entries get a small default and pins
// are dropped (no bpffs path is given). It returns one note per change.
func loadMapDefaults(spec *ebpf.CollectionSpec) []string {
	var notes []string
	for _, name := range slices.Sorted(maps.Keys(spec.Maps)) {
		m := spec.Maps[name]
		if m.Pinning != ebpf.PinNone {
			m.Pinning = ebpf.PinNone
			notes = append(notes, fmt.Sprintf("map %s: not pinned", name))
		}
		if m.MaxEntries != 0 {
			continue
		}
		var n uint32
		switch m.Type {
		case ebpf.RingBuf, ebpf.UserRingbuf:
			// A power of two number of pages.
			n = uint32(os.Getpagesize()) * 64
		case ebpf.Hash, ebpf.Array, ebpf.PerCPUHash, ebpf.PerCPUArray, ebpf.LRUHash, ebpf.LRUCPUHash,
			ebpf.LPMTrie, ebpf.Queue, ebpf.Stack, ebpf.ArrayOfMaps, ebpf.HashOfMaps, ebpf.ProgramArray,
			ebpf.BloomFilter, ebpf.DevMap, ebpf.DevMapHash, ebpf.CPUMap, ebpf.XSKMap, ebpf.SockMap, ebpf.SockHash:
			n = 1
			for _, kv := range m.Contents {
				if k, ok := kv.Key.(uint32); ok && k >= n {
					n = k + 1
				}
			}
		default:
			// Perf event arrays are sized to the CPUs by cilium/ebpf, and
			// storage maps must have 0.
			continue
		}
		m.MaxEntries = n
		notes = append(notes, fmt.Sprintf("map %s: max_entries 0, using %d", name, n))
	}
	return notes
}

func writeLoadProfile(w io.Writer, path string, p *load.Profile) error {
	byRank := slices.Clone(p.Programs)
	slices.SortStableFunc(byRank, func(a, b load.ProgramProfile) int {
		return a.Rank - b.Rank
	})

	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "RANK\tKEY\tPROGRAM\tTYPE\tATTACH\tINSNS\tVERIFIED\tWORKER\tSTART\tEND\tWALL\tRESULT")
	for _, pp := range byRank {
		worker, start, end, wall := "-", "-", "-", "-"
		if pp.Attempts > 0 {
			worker = fmt.Sprint(pp.Worker)
			start, end, wall = loadMs(pp.Start), loadMs(pp.End), loadMs(pp.Wall())
		}
		result := "ok"
		if pp.Err != nil {
			result = "FAILED"
		}
		if pp.Attempts > 1 {
			result += fmt.Sprintf(" (%d attempts)", pp.Attempts)
		}
		fmt.Fprintf(tw, "%d\t%c\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\n",
			pp.Rank, loadKeys[pp.Rank%len(loadKeys)], pp.Name, pp.Type, pp.AttachType,
			pp.Instructions, pp.Verified, worker, start, end, wall, result)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(p.Skipped) > 0 {
		fmt.Fprintf(w, "skipped (type unknown): %s\n", strings.Join(p.Skipped, ", "))
	}

	if p.Makespan > 0 {
		writeLoadTimeline(w, p)
	}

	fmt.Fprintln(w)
	fmt.Fprintf(w, "sequential (sum of loads)  %10s\n", loadMs(p.Work))
	fmt.Fprintf(w, "concurrent makespan        %10s  %.2fx faster\n", loadMs(p.Makespan), p.Speedup())
	fmt.Fprintf(w, "lower bound (%d CPUs)       %10s  makespan = %.3fx the bound\n", p.CPUs, loadMs(p.LowerBound), p.Ratio())
	fmt.Fprintf(w, "%s: %d programs (%d failed), order %s, %d jobs; maps %s, kernel BTF %s, total %s\n",
		path, len(p.Programs), p.Failed(), p.Order, p.Jobs, loadMs(p.Maps), loadMs(p.BTF), loadMs(p.Total))
	return nil
}

// writeLoadTimeline draws one line per worker: each program's load is a run
// of its key letter, idle time is dots.
func writeLoadTimeline(w io.Writer, p *load.Profile) {
	first := time.Duration(math.MaxInt64)
	for _, pp := range p.Programs {
		if pp.Attempts > 0 {
			first = min(first, pp.Start)
		}
	}
	col := func(d time.Duration) int {
		return int(float64(d-first) / float64(p.Makespan) * loadTimelineWidth)
	}
	rows := make([][]byte, p.Jobs)
	for i := range rows {
		rows[i] = []byte(strings.Repeat(".", loadTimelineWidth))
	}
	for _, pp := range p.Programs {
		if pp.Attempts == 0 || pp.Worker < 0 || pp.Worker >= len(rows) {
			continue
		}
		a := min(col(pp.Start), loadTimelineWidth-1)
		e := min(max(col(pp.End), a+1), loadTimelineWidth)
		key := loadKeys[pp.Rank%len(loadKeys)]
		for c := a; c < e; c++ {
			cell := key
			if r := rows[pp.Worker][c]; r != '.' && r != key {
				cell = '*' // several short loads share the column
			}
			rows[pp.Worker][c] = cell
		}
	}
	fmt.Fprintf(w, "\ntimeline (1 column = %s, keys by rank, * = several loads)\n", loadMs(p.Makespan/loadTimelineWidth))
	for i, r := range rows {
		if strings.Trim(string(r), ".") == "" {
			continue // a worker that never ran
		}
		fmt.Fprintf(w, "  worker %-2d |%s|\n", i, r)
	}
}

func loadMs(d time.Duration) string {
	return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
}
