package multiprobe_test

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"testing"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/probetest"
)

// BenchmarkSoak resolves, attaches and closes the same probes over and
// over, as a long-running agent does, and reports what is left after the
// last cycle against before the first: open fds, kernel links of the
// program, the Go heap and the process's RSS. Anything but 0 fds and 0
// links is a leak. Each cycle is one iteration; the numbers are
// 1,000 cycles of 1,000 sites on uprobe_multi and 100 of 10 sites per
// uprobe on the perf-event path, whose detach costs ~0.1 s a site:
//
//	go test -run='^$' -bench='Soak/path=uprobe_multi' -benchtime=1000x .
//	go test -run='^$' -bench='Soak/path=perf_event' -benchtime=100x .
//
// After the last cycle it attaches once more and checks the counts the
// program records for one run of the target, so that a soak that broke
// attaching does not pass for a clean one.
func BenchmarkSoak(b *testing.B) {
	probetest.RequireBPF(b)
	native, perf := nativeAndPerfEvent(b)
	for _, c := range []struct {
		f     kernelprobe.Features
		sites int
	}{{native, 1000}, {perf, 10}} {
		if c.f.Path() == kernelprobe.PathUprobeMulti && !native.UprobeMulti {
			continue
		}
		b.Run("path="+c.f.Path().String(), func(b *testing.B) {
			counter, err := testprogs.LoadCounter(c.f.Path())
			if err != nil {
				b.Fatal(err)
			}
			defer counter.Close()
			target := testprogs.PrivateTarget(b, c.sites)
			probes, err := multiprobe.ParseProbes("uprobe:" + target + ":func_*")
			if err != nil {
				b.Fatal(err)
			}
			cycle := func() *multiprobe.Link {
				pl, err := multiprobe.Resolve(probes, &multiprobe.Options{Features: &c.f})
				if err != nil {
					b.Fatal(err)
				}
				defer pl.Close()
				l, err := pl.Attach(counter.CountEntry)
				if err != nil {
					b.Fatal(err)
				}
				return l
			}
			// One cycle before the measure, so that what is set up
			// once (kernel feature probes, the target's page cache)
			// is not counted as growth.
			cycle().Close()
			before := soakState(b, counter)
			for b.Loop() {
				if err := cycle().Close(); err != nil {
					b.Fatal(err)
				}
			}
			after := soakState(b, counter)
			b.ReportMetric(float64(after.fds-before.fds), "fds-left")
			b.ReportMetric(float64(after.links-before.links), "links-left")
			b.ReportMetric(float64(after.heap-before.heap)/(1<<20), "heap-MB-grown")
			b.ReportMetric(float64(after.rss-before.rss)/(1<<20), "rss-MB-grown")
			b.ReportMetric(float64(after.rss)/(1<<20), "rss-MB")
			if after.fds != before.fds || after.links != before.links {
				b.Errorf("after %d cycles: %d fds and %d links, before %d and %d", b.N, after.fds, after.links, before.fds, before.links)
			}

			l := cycle()
			defer l.Close()
			calls := 1
			runTarget(b, target, calls)
			counts, err := testprogs.ReadArray(counter.Counts, c.sites)
			if err != nil {
				b.Fatal(err)
			}
			// Every cycle's link counted nothing (the target did not
			// run): the counts are this one run's.
			for cookie, s := range l.Sites() {
				i := funcIndex(b, s.Name)
				if want := uint64(testprogs.ExpectedCalls(i, calls)); counts[cookie] != want {
					b.Fatalf("after the soak, %s (cookie %d) counted %d calls, want %d", s.Name, cookie, counts[cookie], want)
				}
			}
		})
	}
}

type soak struct{ fds, links, heap, rss int }

func soakState(b *testing.B, c *testprogs.Counter) soak {
	b.Helper()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	fds, err := testutil.OpenFDs()
	if err != nil {
		b.Fatal(err)
	}
	statm, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		b.Fatal(err)
	}
	f := bytes.Fields(statm)
	pages, err := strconv.Atoi(string(f[1]))
	if err != nil {
		b.Fatal(fmt.Errorf("statm %q: %w", statm, err))
	}
	return soak{
		fds:   fds,
		links: len(probetest.ProgramLinks(b, c.CountEntry)),
		heap:  int(ms.HeapAlloc),
		rss:   pages * os.Getpagesize(),
	}
}
