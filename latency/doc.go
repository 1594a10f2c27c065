// Package latency times probed functions, from each call's entry to its
// return, in log2 histograms of nanoseconds, with a BPF program of its
// own (bcc's funclatency, over thousands of functions with one attach):
//
//	plan, err := latency.Resolve(probes, nil)
//	...
//	t, err := latency.Attach(plan, nil)
//	...
//	defer t.Close()
//	snap, err := t.Snapshot()
//	for _, f := range snap.Functions {
//		fmt.Println(f.Site.Name, f.Count, f.SumNs)
//	}
//
// On Linux 6.13+ each function is a uprobe session (Plan.Session): one
// program run at its entry and at its return, the start time kept by the
// kernel. Elsewhere, and for Go programs (whose returns are probed at
// their return instructions), each function has an entry and a return
// probe, and the start time waits in a map under the frame: the thread
// group and the stack pointer, or for Go the goroutine and the depth in
// its stack, so that recursion, threads and goroutines are timed right.
// The pairing, and how far the stack pointer moved between the two probes
// on each architecture, is this package's to know: a return whose entry it
// did not see (a call already running at attach, or one whose start was
// evicted) is counted in Snapshot.Unmatched.
//
// With Options.By, each call is also timed by the process or cgroup that
// made it, in a bounded table (Options.MaxBy); calls past it are timed by
// function only (Snapshot.Unattributed). A Snapshot may be taken at any
// time while the timer runs. NewForWatch and Fill time the files a
// package watch attaches, each function one histogram over every file
// (or per file, Options.PerFile).
//
// The timer reads registers, whose layout it knows on amd64, arm64,
// riscv64, s390x and ppc64le (only x86-64 and arm64 run in the tests).
package latency
