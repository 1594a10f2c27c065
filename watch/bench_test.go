package watch

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/internal/bpfsys"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/probetest"
)

// benchWatch starts a Watch whose probes match nothing on the machine, so
// that only its event programs run; with stats, the kernel's run-time
// statistics are on for them (which costs each run two clock reads).
func benchWatch(b *testing.B, stats bool) *Watch {
	b.Helper()
	requireEvents(b)
	f, err := kernelprobe.Detect()
	if err != nil {
		b.Fatal(err)
	}
	if stats {
		st, err := ebpf.EnableStats(bpfsys.StatsRunTime)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { st.Close() })
	}
	spec, c := loadCounter(b, f)
	probes, err := multiprobe.ParseProbes("uprobe:" + b.TempDir() + "/none*:f")
	if err != nil {
		b.Fatal(err)
	}
	w, err := New(probes, spec, c.CountEntry, &Options{Plan: multiprobe.Options{Features: &f}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { w.Close() })
	return w
}

// reportRunTime reports the average run time of the events programs over
// the benchmark.
func reportRunTime(b *testing.B, w *Watch) {
	b.Helper()
	for _, p := range []struct {
		name string
		prog *ebpf.Program
	}{{"sys_enter", w.src.objs.SysEnter}, {"sys_exit", w.src.objs.SysExit}, {"exec", w.src.objs.ProcessExec}} {
		st, err := p.prog.Stats()
		if err != nil || st.RunCount == 0 {
			continue
		}
		b.ReportMetric(float64(st.Runtime.Nanoseconds())/float64(st.RunCount), p.name+"-ns/run")
	}
}

// BenchmarkSyscall is the cost of the watch to every system call on the
// node: its sys_enter and sys_exit programs run for each, and return at
// once for all but mmap. Compare watch=off and watch=on with benchstat;
// watch=on+stats says what each program costs a run.
func BenchmarkSyscall(b *testing.B) {
	for _, mode := range []string{"off", "on", "on+stats"} {
		b.Run("watch="+mode, func(b *testing.B) {
			var w *Watch
			if mode != "off" {
				w = benchWatch(b, mode == "on+stats")
			}
			for b.Loop() {
				unix.Getppid()
			}
			if mode == "on+stats" {
				reportRunTime(b, w)
			}
		})
	}
}

// BenchmarkExec is the cost of the watch to a program's start and exit:
// its exec and exit events, and the mmap events of the libraries the
// loader maps, each of which it reads the process's mappings for.
func BenchmarkExec(b *testing.B) {
	for _, mode := range []string{"off", "on", "on+stats"} {
		b.Run("watch="+mode, func(b *testing.B) {
			var w *Watch
			if mode != "off" {
				w = benchWatch(b, mode == "on+stats")
			}
			for b.Loop() {
				if err := exec.Command("/bin/true").Run(); err != nil {
					b.Fatal(err)
				}
			}
			if mode == "on+stats" {
				reportRunTime(b, w)
			}
		})
	}
}

// BenchmarkFirstMapping is the time from a program's start (its fork and
// exec) to the Watch's report of its file attached: each run starts a new
// copy of a small program, whose first mapping the events find. p50 and
// p99 are reported beside the mean.
func BenchmarkFirstMapping(b *testing.B) {
	requireEvents(b)
	f, err := kernelprobe.Detect()
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	data, err := os.ReadFile(testprogs.PrivateTarget(b, 5))
	if err != nil {
		b.Fatal(err)
	}
	spec, c := loadCounter(b, f)
	probes, err := multiprobe.ParseProbes("uprobe:" + dir + "/copy*:func_*")
	if err != nil {
		b.Fatal(err)
	}
	var attached atomic.Int64
	w, err := New(probes, spec, c.CountEntry, &Options{Plan: multiprobe.Options{Features: &f}, Report: func(r Report) {
		if r.What == Attached {
			attached.Add(1)
		}
	}})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	var waits []time.Duration
	i := 0
	for b.Loop() {
		b.StopTimer()
		path := filepath.Join(dir, fmt.Sprint("copy", i))
		i++
		if err := os.WriteFile(path, data, 0o755); err != nil {
			b.Fatal(err)
		}
		want := attached.Load() + 1
		cmd := exec.Command(path, "-wait", "1")
		in, err := cmd.StdinPipe()
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		for attached.Load() < want {
			if time.Since(start) > 10*time.Second {
				b.Fatalf("%s not attached", path)
			}
			time.Sleep(20 * time.Microsecond)
		}
		waits = append(waits, time.Since(start))
		b.StopTimer()
		in.Close()
		cmd.Wait()
		os.Remove(path)
		b.StartTimer()
	}
	slices.Sort(waits)
	b.ReportMetric(float64(waits[len(waits)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(waits[len(waits)*99/100].Nanoseconds()), "p99-ns")
}

// BenchmarkSoakWatch is a watch's lifecycle over and over, a cycle an
// iteration: a new file appears (a new inode, as an upgrade makes), a
// process runs it, the file is deleted and the process exits; the watch
// attaches it and detaches it. After the last cycle the fds, goroutines, the
// program's kernel links, the watch's files, pending files, failures and
// budget are what they were before the first, and the watch still counts
// a new file's calls exactly. The numbers are 1,000 cycles:
//
//	go test -run='^$' -bench=SoakWatch -benchtime=1000x ./watch
func BenchmarkSoakWatch(b *testing.B) {
	requireEvents(b)
	const n, calls = 5, 1
	f, err := kernelprobe.Detect()
	if err != nil {
		b.Fatal(err)
	}
	data, err := os.ReadFile(testprogs.BuildTarget(b, n))
	if err != nil {
		b.Fatal(err)
	}
	spec, c := loadCounter(b, f)
	probes, err := multiprobe.ParseProbes("uprobe:libmpsoak:func_*")
	if err != nil {
		b.Fatal(err)
	}
	var attached, detached atomic.Int64
	w, err := New(probes, spec, c.CountEntry, &Options{Plan: multiprobe.Options{Features: &f}, Report: func(r Report) {
		switch r.What {
		case Attached:
			attached.Add(1)
		case Detached:
			detached.Add(1)
		}
	}})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	path := filepath.Join(b.TempDir(), "libmpsoak.so")
	cycle := func() {
		if err := os.WriteFile(path, data, 0o755); err != nil {
			b.Fatal(err)
		}
		want := attached.Load() + 1
		p := testprogs.Start(b, path, "-wait", "0")
		for deadline := time.Now().Add(10 * time.Second); attached.Load() < want; time.Sleep(100 * time.Microsecond) {
			if time.Now().After(deadline) {
				b.Fatal("a new file not attached in 10 s")
			}
		}
		// Deleted while it runs, as an upgrade replaces a file: its
		// process's exit is when the watch looks.
		if err := os.Remove(path); err != nil {
			b.Fatal(err)
		}
		p.Finish(b)
		for deadline := time.Now().Add(10 * time.Second); detached.Load() < want; time.Sleep(100 * time.Microsecond) {
			if time.Now().After(deadline) {
				b.Fatal("a deleted file not detached in 10 s")
			}
		}
	}
	type state struct{ fds, goroutines, links, files, pending, failures, budget int }
	current := func() state {
		w.closing.Wait() // the detaches' closes
		fds, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			b.Fatal(err)
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		return state{len(fds), runtime.NumGoroutine(), len(probetest.ProgramLinks(b, c.CountEntry)), len(w.files), len(w.pending), len(w.failures), w.budget.all.files + w.budget.all.fds}
	}
	cycle()
	before := current()
	for b.Loop() {
		cycle()
	}
	after := current()
	b.ReportMetric(float64(after.fds-before.fds), "fds-left")
	b.ReportMetric(float64(after.goroutines-before.goroutines), "goroutines-left")
	b.ReportMetric(float64(after.links-before.links), "links-left")
	if after != before {
		b.Errorf("after %d cycles: %+v, before %+v", b.N, after, before)
	}

	// Still counting: one more file, its calls.
	if err := os.WriteFile(path, data, 0o755); err != nil {
		b.Fatal(err)
	}
	want := attached.Load() + 1
	p := testprogs.Start(b, path, "-wait", fmt.Sprint(calls))
	for deadline := time.Now().Add(10 * time.Second); attached.Load() < want; time.Sleep(100 * time.Microsecond) {
		if time.Now().After(deadline) {
			b.Fatal("the last file not attached in 10 s")
		}
	}
	if err := c.Counts.Update(uint32(0), uint64(0), ebpf.UpdateAny); err != nil {
		b.Fatal(err)
	}
	p.Finish(b)
	var k uint64
	if err := c.Counts.Lookup(uint32(w.Files()[0].Link.Sites()[0].Cookie), &k); err != nil {
		b.Fatal(err)
	}
	if want := uint64(testprogs.ExpectedCalls(0, calls)); k != want {
		b.Errorf("after the soak, the first function counted %d calls, want %d", k, want)
	}
}
