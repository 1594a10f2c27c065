package watch

import (
	"time"

	"golang.org/x/sys/unix"
)

// Files that could not be attached.
//
// A file that fails (not an ELF file, no matching symbol, a site the
// kernel refuses) fails again the same way: resolving it again at each
// mapping costs the watch a full parse each time (libcrypto mapped 1,000
// times by one process took 5.7 s of its CPU) and holds back every other
// file meanwhile. So a failure is remembered by the file's key with what
// the file looked like (size, modification and change times), and the
// file is tried again only when it changed, or once its backoff has run
// out while a process still maps it: 1 s, doubling to failRetryMax.

const (
	failRetryFirst = time.Second
	failRetryMax   = 5 * time.Minute
	// maxFailed bounds the failures remembered: past it the oldest is
	// forgotten, and tried again when it is mapped again.
	maxFailed = 10_000
)

// failure is one file's last failure.
type failure struct {
	err     error
	stat    fileStat
	tries   int
	retryAt time.Time
	seq     uint64 // the order failures were recorded in, for maxFailed
}

// fileStat is what tells a file changed in place, or an inode number used
// again for another file.
type fileStat struct {
	size, mtime, ctime int64
}

func statOf(path string) (fileStat, bool) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fileStat{}, false
	}
	return fileStat{st.Size, unix.TimespecToNsec(st.Mtim), unix.TimespecToNsec(st.Ctim)}, true
}

// failed records that f could not be attached, and reports whether it is
// news: the first failure of the file, or another reason than the last.
func (w *Watch) failed(f *tracked, err error) bool {
	old := w.failures[f.key]
	st, _ := statOf(f.hostPath)
	fl := &failure{err: err, stat: st, seq: w.failSeq}
	w.failSeq++
	if old != nil && old.stat == st {
		fl.tries = old.tries + 1
	}
	fl.retryAt = time.Now().Add(min(failRetryFirst<<min(fl.tries, 20), failRetryMax))
	w.failures[f.key] = fl
	if len(w.failures) > maxFailed {
		var oldest fileKey
		first := true
		for k, v := range w.failures {
			if first || v.seq < w.failures[oldest].seq {
				oldest, first = k, false
			}
		}
		delete(w.failures, oldest)
	}
	return old == nil || old.err.Error() != err.Error()
}

// due reports whether f, which failed before, is to be tried again now:
// it changed, or its backoff ran out.
func (w *Watch) due(f *tracked) bool {
	fl := w.failures[f.key]
	if fl == nil {
		return true
	}
	if st, ok := statOf(f.hostPath); ok && st != fl.stat {
		return true
	}
	return !time.Now().Before(fl.retryAt)
}

// retryFailed tries again the failed files that processes still map and
// whose backoff ran out.
func (w *Watch) retryFailed() {
	for k := range w.failures {
		if f := w.tr.files[k]; f != nil && len(f.users) > 0 && w.files[k] == nil && w.due(f) {
			for pid := range f.users {
				w.appeared(f, pid)
				break
			}
		}
	}
}

// again is a file tracked already, mapped by another process: tried again
// if it failed before and changed since, or its backoff ran out.
func (w *Watch) again(f *tracked, pid int) {
	if w.failures[f.key] != nil && w.files[f.key] == nil && w.due(f) {
		w.appeared(f, pid)
	}
}
