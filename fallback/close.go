package fallback

import (
	"errors"
	"os"
	"slices"
	"sync"

	"github.com/cilium/ebpf/link"
	"github.com/multiprobe/multiprobe/internal/bpfsys"
)

// Detaching a per-site uprobe has two parts with different costs (measured
// on Linux 6.18, 2 vCPUs; BenchmarkClose):
//
//   - Closing the BPF perf link (detaching the program) waits about 33 ms,
//     but the waits overlap: 40 links closed concurrently took 68 ms
//     instead of 1.3 s.
//   - Destroying the perf event (removing the breakpoint) waits about 85 ms
//     for RCU grace periods while holding the kernel's event_mutex, so it
//     is serialised whatever user space does.
//
// closeLinks therefore first closes the links concurrently, keeping a
// duplicate of each perf event's descriptor so that the event outlives its
// link, and then closes the perf events. BenchmarkClose, 100 sites,
// -benchtime 1x -count 6, medians: closing each site's link and event
// together one by one (as closing cilium/ebpf links does) 9.86 s ± 7%;
// the same with 64 goroutines 9.30 s ± 3%; two phases 8.64 s ± 5%.
// BenchmarkFallback, attach and detach: 100 sites 8.51 s ± 4% (cilium
// one by one: 10.09 s ± 10%), 1,000 sites 84.3 s (cilium: 101.6 s).
const linkCloseWorkers = 64

// perfCloseWorkers overlaps the part of a perf event's destruction done
// after the kernel's event_mutex is released with the next one's.
const perfCloseWorkers = 4

// closeLinks detaches links: first every program link, concurrently, then
// every perf event.
func closeLinks(links []link.Link, p *progress) error {
	events := make([]*os.File, len(links))
	ids := make([]link.ID, len(links))
	errs := make([]error, 2*len(links))
	parallel(len(links), linkCloseWorkers, func(i int) {
		lk := links[i]
		if pe, ok := lk.(link.PerfEvent); ok {
			// A duplicate descriptor: the event survives the link's
			// Close, which closes the original one.
			if f, err := pe.PerfEvent(); err == nil {
				events[i] = f
			}
		}
		if info, err := lk.Info(); err == nil && !bpfsys.Pinned(lk) {
			ids[i] = info.ID // a BPF perf link (5.15+) that goes with Close
		}
		errs[i] = lk.Close()
	})
	bpfsys.WaitLinksFreed(slices.DeleteFunc(ids, func(id link.ID) bool { return id == 0 }))
	parallel(len(links), perfCloseWorkers, func(i int) {
		if events[i] != nil {
			errs[len(links)+i] = events[i].Close()
		}
		p.add(1)
	})
	return errors.Join(errs...)
}

// parallel calls fn(i) for i in [0, n) with up to workers goroutines.
func parallel(n, workers int, fn func(i int)) {
	workers = min(workers, n)
	if workers <= 1 {
		for i := range n {
			fn(i)
		}
		return
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		next int
	)
	for range workers {
		wg.Go(func() {
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= n {
					return
				}
				fn(i)
			}
		})
	}
	wg.Wait()
}

// closeSequential closes links one after the other, each link and its perf
// event together: the baseline BenchmarkClose compares closeLinks with.
func closeSequential(links []link.Link) error {
	var errs []error
	for _, l := range links {
		errs = append(errs, l.Close())
	}
	return errors.Join(errs...)
}

// closeEach closes links with up to workers goroutines, each link and its
// perf event together.
func closeEach(links []link.Link, workers int) error {
	errs := make([]error, len(links))
	parallel(len(links), workers, func(i int) { errs[i] = links[i].Close() })
	return errors.Join(errs...)
}
