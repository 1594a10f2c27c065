package multiprobe_test

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"

	"github.com/cilium/ebpf"

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

// BenchmarkSoakLifecycles is BenchmarkSoak for a long-running agent's
// other lifecycles, a cycle an iteration: pin (attach, Pin, take back
// with LoadPinnedLink, Close the first, Unpin and Close the second) and
// update (Update of an updatable Link to another set of sites and back).
// After the last cycle the fds, the program's kernel links, the
// goroutines, the kernel's programs and the BPF file system's entries are
// what they were before the first, and a Link attached then counts every
// call of a run of the target exactly. The numbers are 1,000
// cycles:
//
//	go test -run='^$' -bench='SoakLifecycles//path=uprobe_multi' -benchtime=1000x .
func BenchmarkSoakLifecycles(b *testing.B) {
	probetest.RequireBPF(b)
	native, perf := nativeAndPerfEvent(b)
	for _, f := range []kernelprobe.Features{native, perf} {
		if f.Path() == kernelprobe.PathPerfEvent && !f.Cookies {
			continue // no pinnable links before Linux 5.15
		}
		n := 100
		if f.Path() == kernelprobe.PathPerfEvent {
			n = 10 // a detach costs a grace period a site
		}
		for _, lc := range []string{"pin", "update"} {
			b.Run("lifecycle="+lc+"/path="+f.Path().String(), func(b *testing.B) {
				target := testprogs.PrivateTarget(b, n)
				bpffs := testutil.BPFFS(b)
				spec, err := testprogs.CounterSpec()
				if err != nil {
					b.Fatal(err)
				}
				// The counter is loaded from the spec every plan
				// prepared, as an updatable Link needs.
				var counter *testprogs.Counter
				load := func() *testprogs.Counter {
					if counter == nil {
						if counter, err = testprogs.NewCounter(spec); err != nil {
							b.Fatal(err)
						}
						b.Cleanup(func() { counter.Close() })
					}
					return counter
				}
				resolve := func(specs string, opts multiprobe.Options) *multiprobe.Plan {
					probes, err := multiprobe.ParseProbes("uprobe:" + target + ":" + specs)
					if err != nil {
						b.Fatal(err)
					}
					opts.Features = &f
					pl, err := multiprobe.Resolve(probes, &opts)
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(func() { pl.Close() })
					if err := pl.Prepare(spec); err != nil {
						b.Fatal(err)
					}
					return pl
				}
				cycle, last := soakLifecycle(b, lc, load, bpffs+"/link", resolve)
				cycle()
				before := lifecycleState(b, counter, bpffs)
				for b.Loop() {
					cycle()
				}
				after := lifecycleState(b, counter, bpffs)
				b.ReportMetric(float64(after.fds-before.fds), "fds-left")
				b.ReportMetric(float64(after.links-before.links), "links-left")
				b.ReportMetric(float64(after.goroutines-before.goroutines), "goroutines-left")
				b.ReportMetric(float64(after.progs-before.progs), "progs-left")
				b.ReportMetric(float64(after.pins-before.pins), "pins-left")
				b.ReportMetric(float64(after.rss-before.rss)/(1<<20), "rss-MB-grown")
				if after != before {
					after.rss, before.rss = 0, 0
				}
				if after != before {
					b.Errorf("after %d cycles: %+v, before %+v", b.N, after, before)
				}

				l := last()
				defer l.Close()
				calls := 1
				runTarget(b, target, calls)
				counts, err := testprogs.ReadArray(counter.Counts, n)
				if err != nil {
					b.Fatal(err)
				}
				for cookie, s := range l.Sites() {
					if want := uint64(testprogs.ExpectedCalls(funcIndex(b, s.Name), calls)); counts[cookie] != want {
						b.Fatalf("after the soak, %s (cookie %d) counted %d calls, want %d", s.Name, cookie, counts[cookie], want)
					}
				}
			})
		}
	}
}

// soakLifecycle returns a cycle of lifecycle lc, and what attaches the
// Link whose counts are checked after the soak. load loads the counter
// once every plan is resolved and has prepared its spec.
func soakLifecycle(b *testing.B, lc string, load func() *testprogs.Counter, dir string, resolve func(string, multiprobe.Options) *multiprobe.Plan) (cycle func(), last func() *multiprobe.Link) {
	switch lc {
	case "pin":
		pl := resolve("func_*", multiprobe.Options{})
		counter := load()
		return func() {
				first, err := pl.Attach(counter.CountEntry)
				if err != nil {
					b.Fatal(err)
				}
				if err := first.Pin(dir); err != nil {
					b.Fatal(err)
				}
				back, err := multiprobe.LoadPinnedLink(dir)
				if err != nil {
					b.Fatal(err)
				}
				if err := errors.Join(first.Close(), back.Unpin(), back.Close()); err != nil {
					b.Fatal(err)
				}
			}, func() *multiprobe.Link {
				l, err := pl.Attach(counter.CountEntry)
				if err != nil {
					b.Fatal(err)
				}
				return l
			}
	case "update":
		opts := multiprobe.Options{Updatable: true}
		all, odd := resolve("func_*", opts), resolve("func_*[13579]", opts)
		l, err := all.Attach(load().CountEntry)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { l.Close() })
		return func() {
			if err := l.Update(odd); err != nil {
				b.Fatal(err)
			}
			if err := l.Update(all); err != nil {
				b.Fatal(err)
			}
		}, func() *multiprobe.Link { return l }
	}
	b.Fatalf("no lifecycle %q", lc)
	return nil, nil
}

type lifecycle struct{ fds, links, goroutines, progs, pins, rss int }

func lifecycleState(b *testing.B, c *testprogs.Counter, bpffs string) lifecycle {
	b.Helper()
	s := soakState(b, c)
	progs := 0
	for id := ebpf.ProgramID(0); ; progs++ {
		next, err := ebpf.ProgramGetNextID(id)
		if err != nil {
			break
		}
		id = next
	}
	pins := 0
	filepath.WalkDir(bpffs, func(string, fs.DirEntry, error) error { pins++; return nil })
	return lifecycle{fds: s.fds, links: s.links, goroutines: runtime.NumGoroutine(), progs: progs, pins: pins, rss: s.rss}
}
