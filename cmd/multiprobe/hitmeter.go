package main

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/cilium/ebpf"
)

// defaultMaxRate is the hit rate over which count warns (--max-rate): a
// uprobe hit traps into the kernel, about 1 to 3 µs on this project's
// machines and 10 to 30 in a VM, so 100,000 hits a second are a tenth to
// all of a CPU taken from the traced programs. (count 'uprobe:node:*' --
// node -e 1 took 5.5 minutes for 12.7 million hits, without a word.)
const defaultMaxRate = 100_000

// A hitMeter reads the counter's array once a second while count runs
// and says once on stderr, with the rate and the hottest sites, when the
// probes hit more often than maxRate times a second: their cost is then
// no surprise, and the user can narrow the pattern.
type hitMeter struct {
	counts  *ebpf.Map
	slots   func() int            // how many of counts' slots are sites now
	name    func(i uint32) string // site i's name
	maxRate float64
	stderr  io.Writer
	quit    chan struct{}
	done    chan struct{}
}

// startHitMeter starts the meter; stop ends it. With maxRate 0 it does
// nothing.
func startHitMeter(counts *ebpf.Map, slots func() int, name func(uint32) string, maxRate int, stderr io.Writer) *hitMeter {
	m := &hitMeter{counts: counts, slots: slots, name: name, maxRate: float64(maxRate), stderr: stderr, quit: make(chan struct{}), done: make(chan struct{})}
	if maxRate <= 0 {
		close(m.done)
		return m
	}
	go m.run()
	return m
}

func (m *hitMeter) stop() {
	select {
	case <-m.quit:
	default:
		close(m.quit)
	}
	<-m.done
}

func (m *hitMeter) run() {
	defer close(m.done)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var last []uint64
	lastAt := time.Now()
	for {
		select {
		case <-m.quit:
			return
		case <-t.C:
		}
		now, err := readCounts(m.counts, m.slots())
		if err != nil {
			return
		}
		at := time.Now()
		secs := at.Sub(lastAt).Seconds()
		type hot struct {
			site uint32
			rate float64
		}
		var total float64
		var hots []hot
		for i, n := range now {
			d := n
			if i < len(last) {
				d -= last[i]
			}
			if d > 0 {
				r := float64(d) / secs
				total += r
				hots = append(hots, hot{uint32(i), r})
			}
		}
		last, lastAt = now, at
		if total <= m.maxRate {
			continue
		}
		slices.SortFunc(hots, func(a, b hot) int { return cmp.Compare(b.rate, a.rate) })
		var names []string
		for _, h := range hots[:min(3, len(hots))] {
			names = append(names, fmt.Sprintf("%s %.0f/s", m.name(h.site), h.rate))
		}
		fmt.Fprintf(m.stderr, "warning: the probes hit %.0f times a second, over --max-rate %.0f: each hit traps into the kernel (1 to 3 µs, 10 to 30 in a VM), "+
			"which slows what runs there; the hottest: %s (narrow the pattern, or leave them out with '!NAME')\n", total, m.maxRate, strings.Join(names, ", "))
		return
	}
}

// readCounts reads the first n slots of the counter's array, in batches
// where the kernel has them (Linux 5.6), else one at a time.
func readCounts(counts *ebpf.Map, n int) ([]uint64, error) {
	out := make([]uint64, n)
	if n == 0 {
		return out, nil
	}
	keys := make([]uint32, n)
	var cursor ebpf.MapBatchCursor
	got := 0
	for got < n {
		k, err := counts.BatchLookup(&cursor, keys[got:], out[got:], nil)
		got += k
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			if got > 0 {
				return nil, err
			}
			for i := range n {
				if err := counts.Lookup(uint32(i), &out[i]); err != nil {
					return nil, err
				}
			}
			return out, nil
		}
	}
	// A batch gives keys in order for an array, from 0.
	return out, nil
}
