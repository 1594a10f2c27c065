package multiprobe_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/multiprobe/multiprobe/attach"
	"github.com/multiprobe/multiprobe/probetest"

	"github.com/cilium/ebpf/link"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/kernelprobe"
)

// BenchmarkAttach measures attach plus detach of N sites selected by a glob,
// resolution included (attach-ms: without the detach), against
// cilium/ebpf's Executable.UprobeMulti given the symbol names, and, at
// 1,000 sites, against cilium's per-site Executable.Uprobe (about 0.1 s per
// site to close: run it with -benchtime=1x). BenchmarkAttachRatio makes
// the same comparison less exposed to drift. Compare with:
//
//	go test -run='^$' -bench='Attach/sites=(1000|10000|100000)/impl=(multiprobe|cilium-multi)' -count=10 . | tee /tmp/a.txt
//	benchstat -col /impl /tmp/a.txt
func BenchmarkAttach(b *testing.B) {
	probetest.RequireBPF(b)
	c, err := testprogs.LoadCounter(kernelprobe.PathUprobeMulti)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	perSite, err := testprogs.LoadCounter(kernelprobe.PathPerfEvent)
	if err != nil {
		b.Fatal(err)
	}
	defer perSite.Close()

	for _, n := range []int{1000, 10_000, 100_000} {
		target, names, probes := benchTarget(b, n)
		b.Run(fmt.Sprintf("sites=%d/impl=multiprobe", n), func(b *testing.B) {
			fds := 0
			var attach time.Duration
			for b.Loop() {
				t0 := time.Now()
				l, err := attachProbes(c.CountEntry, probes)
				attach += time.Since(t0)
				if err != nil {
					b.Fatal(err)
				}
				fds = 0
				for _, al := range l.Links() {
					fds += al.NumFDs()
				}
				l.Close()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/site")
			b.ReportMetric(float64(fds), "fds")
			b.ReportMetric(float64(attach.Microseconds())/1000/float64(b.N), "attach-ms")
		})
		b.Run(fmt.Sprintf("sites=%d/impl=cilium-multi", n), func(b *testing.B) {
			var attach time.Duration
			for b.Loop() {
				t0 := time.Now()
				ex, err := link.OpenExecutable(target)
				if err != nil {
					b.Fatal(err)
				}
				l, err := ex.UprobeMulti(names, c.CountEntry, nil)
				attach += time.Since(t0)
				if err != nil {
					b.Fatal(err)
				}
				l.Close()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/site")
			b.ReportMetric(1, "fds")
			b.ReportMetric(float64(attach.Microseconds())/1000/float64(b.N), "attach-ms")
		})
		if n != 1000 {
			continue
		}
		b.Run(fmt.Sprintf("sites=%d/impl=cilium-per-site", n), func(b *testing.B) {
			for b.Loop() {
				ex, err := link.OpenExecutable(target)
				if err != nil {
					b.Fatal(err)
				}
				var links []link.Link
				for _, name := range names {
					l, err := ex.Uprobe(name, perSite.CountEntry, nil)
					if err != nil {
						b.Fatal(err)
					}
					links = append(links, l)
				}
				for _, l := range links {
					l.Close()
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/site")
			b.ReportMetric(float64(2*n), "fds")
		})
	}
}

// BenchmarkAttachRatio pairs, in every iteration, one multiprobe attach and
// detach (resolution included) with one cilium UprobeMulti by names, in
// alternating order, so that both see the same machine: on a noisy one, separate runs
// drift more than the difference. It reports each side's attach time
// (without the detach), whole cycle, and their ratios, multiprobe over
// cilium:
//
//	go test -run='^$' -bench=AttachRatio -benchtime=8x -count=10 . | tee /tmp/r.txt; benchstat /tmp/r.txt
//
// It also measures the floor, a bare uprobe_multi link create (package
// attach) with the offsets and cookies computed beforehand, and reports
// multiprobe's attach over it (floor-ratio). The Sites, with their names,
// are built only when asked for: mp-sites-ms is the first Link.Sites call,
// apart from the attach, as cilium's attach returns no names.
func BenchmarkAttachRatio(b *testing.B) {
	probetest.RequireBPF(b)
	c, err := testprogs.LoadCounter(kernelprobe.PathUprobeMulti)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	for _, n := range []int{1000, 10_000, 100_000} {
		target, names, probes := benchTarget(b, n)
		b.Run(fmt.Sprintf("sites=%d", n), func(b *testing.B) {
			var mpAttach, mpCycle, mpSites, ciAttach, ciCycle, flAttach time.Duration
			// The floor: one bare uprobe_multi link create with the
			// offsets and cookies already computed.
			floorTargets := floorOf(b, probes)
			fl := func() {
				t0 := time.Now()
				l, err := attach.UprobeMulti(c.CountEntry, floorTargets, nil)
				if err != nil {
					b.Fatal(err)
				}
				flAttach += time.Since(t0)
				l.Close()
			}
			mp := func() {
				t0 := time.Now()
				l, err := attachProbes(c.CountEntry, probes)
				if err != nil {
					b.Fatal(err)
				}
				mpAttach += time.Since(t0)
				l.Close()
				mpCycle += time.Since(t0)
				// Apart: the names, which cilium's attach does not
				// return, are read when first asked for.
				t1 := time.Now()
				if len(l.Sites()) != n {
					b.Fatalf("%d sites, want %d", len(l.Sites()), n)
				}
				mpSites += time.Since(t1)
			}
			ci := func() {
				t0 := time.Now()
				ex, err := link.OpenExecutable(target)
				if err != nil {
					b.Fatal(err)
				}
				cl, err := ex.UprobeMulti(names, c.CountEntry, nil)
				if err != nil {
					b.Fatal(err)
				}
				ciAttach += time.Since(t0)
				cl.Close()
				ciCycle += time.Since(t0)
			}
			// Which goes first alternates: a detach's cost depends on
			// the kernel's RCU grace periods, which the one before it
			// may have started.
			first := true
			for b.Loop() {
				if first {
					mp()
					ci()
					fl()
				} else {
					fl()
					ci()
					mp()
				}
				first = !first
			}
			ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(b.N) }
			b.ReportMetric(ms(mpAttach), "mp-attach-ms")
			b.ReportMetric(ms(mpSites), "mp-sites-ms")
			b.ReportMetric(ms(ciAttach), "cilium-attach-ms")
			b.ReportMetric(float64(mpAttach)/float64(ciAttach), "attach-ratio")
			b.ReportMetric(float64(mpCycle)/float64(ciCycle), "cycle-ratio")
			b.ReportMetric(ms(flAttach), "floor-attach-ms")
			b.ReportMetric(float64(mpAttach)/float64(flAttach), "floor-ratio")
		})
	}
}

// attachProbes is the whole user path for a program that needs no
// preparing (uprobe_multi, cookies, no pids): resolve, then attach.
func attachProbes(prog *ebpf.Program, probes []multiprobe.Probe) (*multiprobe.Link, error) {
	pl, err := multiprobe.Resolve(probes, nil)
	if err != nil {
		return nil, err
	}
	defer pl.Close()
	return pl.Attach(prog)
}

// floorOf computes the targets of probes once, for the floor measurement.
func floorOf(b *testing.B, probes []multiprobe.Probe) []attach.Target {
	b.Helper()
	pl, err := multiprobe.Resolve(probes, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer pl.Close()
	var t attach.Target
	for _, s := range pl.Sites() {
		t.Path = s.Path
		t.Offsets = append(t.Offsets, s.Offset)
		t.Cookies = append(t.Cookies, s.Cookie)
	}
	return []attach.Target{t}
}

// benchTarget builds a target of n functions and returns it with the names
// of its functions, for cilium, and the probe that selects them by a glob.
func benchTarget(b *testing.B, n int) (target string, names []string, probes []multiprobe.Probe) {
	target = testprogs.BuildTarget(b, n)
	names = make([]string, n)
	for i := range names {
		names[i] = testprogs.FuncName(i)
	}
	probes, err := multiprobe.ParseProbes("uprobe:" + target + ":func_*")
	if err != nil {
		b.Fatal(err)
	}
	return target, names, probes
}

// BenchmarkClones measures what a kernel without BPF cookies (before Linux
// 5.15) costs at attach: per-site perf-event uprobes with a clone of the
// program per site, each with its cookie built in, against the same
// uprobes carrying BPF cookies. On a newer kernel the no-cookie side is
// forced (Features), which loads and attaches exactly as on 5.10. Detaching
// a perf-event uprobe costs ~0.1 s here, so use few iterations:
//
//	go test -run='^$' -bench=Clones -benchtime=1x -count=5 . | tee /tmp/c.txt; benchstat -col /cookies /tmp/c.txt
func BenchmarkClones(b *testing.B) {
	probetest.RequireBPF(b)
	native, perf := nativeAndPerfEvent(b)
	noCookies := perf
	noCookies.Cookies = false
	for _, n := range []int{100, 1000} {
		_, _, probes := benchTarget(b, n)
		for _, f := range []kernelprobe.Features{perf, noCookies} {
			if f.Cookies && !native.Cookies {
				continue
			}
			b.Run(fmt.Sprintf("sites=%d/cookies=%v", n, f.Cookies), func(b *testing.B) {
				pl, err := multiprobe.Resolve(probes, &multiprobe.Options{Features: &f})
				if err != nil {
					b.Fatal(err)
				}
				defer pl.Close()
				spec, err := testprogs.CounterSpec()
				if err != nil {
					b.Fatal(err)
				}
				if err := pl.Prepare(spec); err != nil {
					b.Fatal(err)
				}
				c, err := testprogs.NewCounter(spec)
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				var attach time.Duration
				clones := 0
				for b.Loop() {
					t0 := time.Now()
					l, err := pl.Attach(c.CountEntry)
					if err != nil {
						b.Fatal(err)
					}
					attach += time.Since(t0)
					clones = l.NumClones()
					l.Close()
				}
				b.ReportMetric(float64(attach.Microseconds())/1000/float64(b.N), "attach-ms")
				b.ReportMetric(float64(clones), "clones")
			})
		}
	}
}

// nativeAndPerfEvent returns the kernel's features, and the same with
// uprobe_multi turned off, which takes the perf-event path.
func nativeAndPerfEvent(tb testing.TB) (native, perf kernelprobe.Features) {
	tb.Helper()
	native, err := kernelprobe.Detect()
	if err != nil {
		tb.Fatal(err)
	}
	perf = native
	perf.UprobeMulti, perf.UprobeMultiPIDFilter, perf.UprobeSession = false, false, false
	return native, perf
}

// BenchmarkPinned measures, for 10,000 sites of one binary on the
// uprobe_multi path, what an agent pays to get its probes back after a
// restart (op=restore: LoadPinnedLink, then Close leaving them pinned) and
// to change them (op=update: Update to a set with one site fewer, or
// back), against attaching them anew (op=attach: Attach, then Close; and
// op=resolve+attach, what a restart without pins does).
// All three load the program copy with the generation check
// (Options.Updatable) where they attach.
func BenchmarkPinned(b *testing.B) {
	probetest.RequireBPF(b)
	f, err := kernelprobe.Detect()
	if err != nil {
		b.Fatal(err)
	}
	if f.Path() != kernelprobe.PathUprobeMulti {
		b.Skip("uprobe_multi path only")
	}
	const n = 10_000
	target, _, probes := benchTarget(b, n)
	fewer, err := multiprobe.ParseProbes("uprobe:" + target + ":func_*,!" + testprogs.FuncName(n-1))
	if err != nil {
		b.Fatal(err)
	}
	spec, err := testprogs.CounterSpec()
	if err != nil {
		b.Fatal(err)
	}
	var plans []*multiprobe.Plan
	for _, p := range [][]multiprobe.Probe{probes, fewer} {
		pl, err := multiprobe.Resolve(p, &multiprobe.Options{Updatable: true})
		if err != nil {
			b.Fatal(err)
		}
		defer pl.Close()
		if err := pl.Prepare(spec); err != nil {
			b.Fatal(err)
		}
		plans = append(plans, pl)
	}
	c, err := testprogs.NewCounter(spec)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()

	b.Run("op=attach", func(b *testing.B) {
		for b.Loop() {
			l, err := plans[0].Attach(c.CountEntry)
			if err != nil {
				b.Fatal(err)
			}
			l.Close()
		}
	})
	b.Run("op=resolve+attach", func(b *testing.B) {
		for b.Loop() {
			pl, err := multiprobe.Resolve(probes, &multiprobe.Options{Updatable: true})
			if err != nil {
				b.Fatal(err)
			}
			if err := pl.Prepare(spec); err != nil {
				b.Fatal(err)
			}
			l, err := pl.Attach(c.CountEntry)
			if err != nil {
				b.Fatal(err)
			}
			l.Close()
			pl.Close()
		}
	})
	b.Run("op=restore", func(b *testing.B) {
		dir := testutil.BPFFS(b) + "/agent"
		l, err := plans[0].Attach(c.CountEntry)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Pin(dir); err != nil {
			b.Fatal(err)
		}
		l.Close()
		for b.Loop() {
			back, err := multiprobe.LoadPinnedLink(dir)
			if err != nil {
				b.Fatal(err)
			}
			back.Close()
		}
		back, err := multiprobe.LoadPinnedLink(dir)
		if err != nil {
			b.Fatal(err)
		}
		back.Unpin()
		back.Close()
	})
	b.Run("op=update", func(b *testing.B) {
		l, err := plans[0].Attach(c.CountEntry)
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		i := 0
		for b.Loop() {
			i++
			if err := l.Update(plans[i%2]); err != nil {
				b.Fatal(err)
			}
		}
	})
}
