package pidfilter_test

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/multiprobe/multiprobe/attach"
	"github.com/multiprobe/multiprobe/fallback"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/pidfilter"
	"github.com/multiprobe/multiprobe/probetest"
)

// buildThreads returns a private copy of the threads target: uprobes
// belong to the file, so no other test may run it.
func buildThreads(t testing.TB) string {
	t.Helper()
	return testprogs.PrivateCopy(t, testprogs.ThreadsTarget(t))
}

// startWaiting starts the threads target, which makes its calls, from
// threads threads, when it is told to go.
func startWaiting(t testing.TB, bin string, threads, calls int) *testprogs.Proc {
	t.Helper()
	return testprogs.Start(t, bin, "-wait", fmt.Sprint(threads), fmt.Sprint(calls))
}

// run lets the process make its calls and waits for it to exit.
func run(t testing.TB, p *testprogs.Proc) {
	t.Helper()
	if out := p.Finish(t); out != "done" {
		t.Fatalf("target printed %q, want done", out)
	}
}

// loadFilteredColl loads testdata/filtered.c for path p with the pid filter
// injected into its entry program, and wires the tail call.
func loadFilteredColl(t testing.TB, p kernelprobe.Path, inject bool) (*ebpf.Collection, *pidfilter.Filter) {
	t.Helper()
	spec, err := loadFiltered()
	if err != nil {
		t.Fatal(err)
	}
	kernelprobe.PrepareCollectionSpec(spec, p)
	if inject {
		if err := pidfilter.Inject(spec, "filtered_entry"); err != nil {
			t.Fatal(err)
		}
	}
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			t.Fatalf("%+v", ve)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { coll.Close() })
	if err := coll.Maps["jump"].Put(uint32(0), coll.Programs["tail_target"]); err != nil {
		t.Fatal(err)
	}
	if !inject {
		return coll, nil
	}
	f, err := pidfilter.FromCollection(coll)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return coll, f
}

func attachPath(t testing.TB, p kernelprobe.Path, prog *ebpf.Program, target attach.Target, pid int) io.Closer {
	t.Helper()
	var (
		l   io.Closer
		err error
	)
	switch p {
	case kernelprobe.PathUprobeMulti:
		// No kernel pid filter: the injected one does the work, as on
		// 6.6–6.9 or for several pids.
		l, err = attach.UprobeMulti(prog, []attach.Target{target}, nil)
	case kernelprobe.PathPerfEvent:
		l, err = fallback.Uprobes(prog, []attach.Target{target}, nil)
	}
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func readHash(t *testing.T, m *ebpf.Map) map[uint32]uint64 {
	t.Helper()
	out := map[uint32]uint64{}
	var (
		k uint32
		v uint64
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		out[k] = v
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestFilterThreads runs a multi-threaded target twice with the filter on
// one of them, on both attach paths, then changes the set while attached.
func TestFilterThreads(t *testing.T) {
	probetest.RequireBPF(t)
	bin := buildThreads(t)
	offs, err := testprogs.SymbolOffsets(bin)
	if err != nil {
		t.Fatal(err)
	}
	target := attach.Target{Path: bin, Offsets: []uint64{offs["mt_func"]}, Cookies: []uint64{0}}
	feat, err := kernelprobe.Detect()
	if err != nil {
		t.Fatal(err)
	}
	const threads, calls = 4, 50

	for _, p := range []kernelprobe.Path{kernelprobe.PathUprobeMulti, kernelprobe.PathPerfEvent} {
		t.Run(p.String(), func(t *testing.T) {
			if p == kernelprobe.PathUprobeMulti {
				testutil.RequireKernelFeature(t, feat.UprobeMulti, "uprobe_multi")
			}
			coll, f := loadFilteredColl(t, p, true)
			prog := coll.Programs["filtered_entry"]
			snap := probetest.TakeSnapshot(t, prog)

			a := startWaiting(t, bin, threads, calls)
			b := startWaiting(t, bin, threads, calls)
			if err := f.Acquire(a.PID()); err != nil {
				t.Fatal(err)
			}
			l := attachPath(t, p, prog, target, a.PID())
			run(t, a)
			run(t, b)

			pids := readHash(t, coll.Maps["pid_counts"])
			if pids[uint32(a.PID())] != threads*calls || len(pids) != 1 {
				t.Errorf("pid counts %v, want only %d: %d", pids, a.PID(), threads*calls)
			}
			tids := readHash(t, coll.Maps["tid_counts"])
			if len(tids) != threads {
				t.Errorf("%d threads counted (%v), want %d", len(tids), tids, threads)
			}
			for tid, n := range tids {
				if n != calls {
					t.Errorf("thread %d: %d calls counted, want %d", tid, n, calls)
				}
			}
			stages, err := testprogs.ReadArray(coll.Maps["stages"], 4)
			if err != nil {
				t.Fatal(err)
			}
			for i, n := range stages {
				if n != threads*calls {
					t.Errorf("stage %d (entry, static call, global call, tail call) ran %d times, want %d", i, n, threads*calls)
				}
			}

			// Change the set while attached.
			c := startWaiting(t, bin, threads, calls)
			d := startWaiting(t, bin, threads, calls)
			if err := f.Replace([]int{a.PID()}, []int{d.PID()}); err != nil {
				t.Fatal(err)
			}
			if got, err := f.PIDs(); err != nil || len(got) != 1 || got[0] != d.PID() {
				t.Errorf("PIDs() = %v, %v; want [%d]", got, err, d.PID())
			}
			run(t, c)
			run(t, d)
			pids = readHash(t, coll.Maps["pid_counts"])
			if pids[uint32(d.PID())] != threads*calls || pids[uint32(a.PID())] != threads*calls || len(pids) != 2 {
				t.Errorf("after Replace to %d: pid counts %v, want %d and %d with %d each", d.PID(), pids, a.PID(), d.PID(), threads*calls)
			}

			// AllPIDs lets every process through, beside the set.
			e := startWaiting(t, bin, threads, calls)
			if err := f.Acquire(pidfilter.AllPIDs); err != nil {
				t.Fatal(err)
			}
			run(t, e)
			pids = readHash(t, coll.Maps["pid_counts"])
			if pids[uint32(e.PID())] != threads*calls || len(pids) != 3 {
				t.Errorf("with AllPIDs held: pid counts %v, want %d with %d beside the earlier two", pids, e.PID(), threads*calls)
			}

			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			snap.Check(t, "after Close")
		})
	}
}

// TestWithoutFilter is the control: the same program without the filter
// counts both processes, so TestFilterThreads's checks can fail.
func TestWithoutFilter(t *testing.T) {
	probetest.RequireBPF(t)
	bin := buildThreads(t)
	offs, err := testprogs.SymbolOffsets(bin)
	if err != nil {
		t.Fatal(err)
	}
	feat, err := kernelprobe.Detect()
	if err != nil {
		t.Fatal(err)
	}
	p := feat.Path()
	coll, _ := loadFilteredColl(t, p, false)
	a := startWaiting(t, bin, 2, 10)
	b := startWaiting(t, bin, 2, 10)
	l := attachPath(t, p, coll.Programs["filtered_entry"], attach.Target{Path: bin, Offsets: []uint64{offs["mt_func"]}}, 0)
	defer l.Close()
	run(t, a)
	run(t, b)
	pids := readHash(t, coll.Maps["pid_counts"])
	if pids[uint32(a.PID())] != 20 || pids[uint32(b.PID())] != 20 {
		t.Errorf("pid counts %v, want %d and %d with 20 each", pids, a.PID(), b.PID())
	}
}
