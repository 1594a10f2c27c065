package elfsym

import "runtime"

// tuning says when a lookup splits its work between CPUs, and how. A File
// carries its own, so that a test can try every split on a File of its own
// while other tests run.
type tuning struct {
	// parallelStrings is the string table size from which candidates
	// splits its search; parallelScan the number of symbols from which
	// scan does; parallelSites the number of sites from which finish
	// does: below them, starting goroutines costs more than it saves.
	parallelStrings, parallelScan, parallelSites int
	// cpus, if not 0, stands for GOMAXPROCS.
	cpus int
	// noPack sorts as for a file past packed keys' reach (more than 16
	// million symbols, or offsets past 1 TiB): for tests.
	noPack bool
}

var defaultTuning = tuning{parallelStrings: 1 << 20, parallelScan: 1 << 15, parallelSites: 1 << 14}

// procs is how many CPUs a lookup may use.
func (t *tuning) procs() int {
	if t.cpus > 0 {
		return t.cpus
	}
	return runtime.GOMAXPROCS(0)
}
