package pidfilter_test

import (
	"testing"

	"github.com/cilium/ebpf"
	"github.com/multiprobe/multiprobe/attach"
	"github.com/multiprobe/multiprobe/internal/bpfsys"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/pidfilter"
	"github.com/multiprobe/multiprobe/probetest"
)

// BenchmarkPIDFilter measures what the injected filter costs per program
// run, from the kernel's BPF statistics (bpf-ns/run): the program
// testdata/filtered.c without the filter, with it and the process in the
// set, with it and the process not in the set (the prologue alone), and
// with it admitting every process (one inlined array read, no lookup).
// ns/op is the whole call of a probed function, uprobe trap included.
//
//	go test -run '^$' -bench PIDFilter -count 6 ./pidfilter
func BenchmarkPIDFilter(b *testing.B) {
	probetest.RequireBPF(b)
	stats, err := ebpf.EnableStats(bpfsys.StatsRunTime)
	if err != nil {
		probetest.Unavailable(b, "BPF run-time statistics: %v", err)
	}
	defer stats.Close()
	bin := buildThreads(b)
	offs, err := testprogs.SymbolOffsets(bin)
	if err != nil {
		b.Fatal(err)
	}
	feat, err := kernelprobe.Detect()
	if err != nil {
		b.Fatal(err)
	}
	p := feat.Path()
	target := attach.Target{Path: bin, Offsets: []uint64{offs["mt_func"]}}

	for _, bc := range []struct {
		name              string
		inject, pass, all bool
	}{
		{"off", false, true, false},
		{"on/pass", true, true, false},
		{"on/drop", true, false, false},
		{"on/all", true, true, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			coll, f := loadFilteredColl(b, p, bc.inject)
			prog := coll.Programs["filtered_entry"]
			l := attachPath(b, p, prog, target, 0)
			defer l.Close()
			before, err := prog.Stats()
			if err != nil {
				b.Fatal(err)
			}
			w := startWaiting(b, bin, 1, b.N)
			if f != nil && bc.pass {
				pid := w.PID()
				if bc.all {
					pid = pidfilter.AllPIDs
				}
				if err := f.Acquire(pid); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			run(b, w)
			b.StopTimer()
			after, err := prog.Stats()
			if err != nil {
				b.Fatal(err)
			}
			runs := after.RunCount - before.RunCount
			if runs != uint64(b.N) {
				b.Fatalf("program ran %d times for %d calls", runs, b.N)
			}
			b.ReportMetric(float64(after.Runtime-before.Runtime)/float64(runs), "bpf-ns/run")
		})
	}
}
