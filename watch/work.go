package watch

import (
	"errors"
	"io/fs"
)

// Attaching off the lock.
//
// Resolving a file, preparing its program and attaching it take from a
// millisecond to seconds (a 100 MB binary, a kernel that waits out a grace
// period): done on the event goroutine under the watch's lock, every
// other file waited for it, and so did Files (an agent's scrape) and
// Close; on emulated arm64 20 copies of libc queued for 1.3 s. So a file
// that appears is queued, pending, and attached by one of a few workers
// with no lock held; the tracker goes on meanwhile. A pending file is not
// in Files, is not detached when its processes exit (its worker looks
// when it is done), and is not queued twice. Close drops what waits in
// the queue and lets the workers finish what they hold.

// testAttaching, if not nil, is told of each file a worker takes, before
// it attaches it: a test holds a worker there.
var testAttaching func(path string)

// workers is how many files are attached at once. Resolves take turns
// (see Watch.plan); what runs side by side is the rest: preparing the
// program, the kernel's attach, pinning.
const workers = 4

// job is a file waiting for a worker, or being attached by one.
type job struct {
	f *tracked
	// path and hostPath are f's, copied: the tracker owns f's fields.
	path, hostPath   string
	hostDev, hostIno uint64
	pid              int
	owner            owner
	seq              uint64 // the order jobs were queued in
	// old, if not nil, is the file's link taken back from a pin, which
	// the job brings to the Watch's probes and program (update.go).
	old *attached
}

// enqueue queues f, mapped by pid, for a worker, unless it is pending
// already, the watch is closing, or it is over its owner's budget (see
// budget.go), which is reported as its failure. w.mu is held.
func (w *Watch) enqueue(f *tracked, pid int) {
	if w.pending[f.key] != nil || w.stopping {
		return
	}
	o := ownerOf(pid)
	if err := w.budget.admit(o, f.path, pid); err != nil {
		if w.failed(f, err) {
			w.report(Report{What: Skipped, Path: f.path, PID: pid, HostPath: f.hostPath, File: f.key.id(), Err: err})
		}
		return
	}
	w.budget.queued(o)
	j := &job{f: f, path: f.path, hostPath: f.hostPath, hostDev: f.hostDev, hostIno: f.hostIno, pid: pid, owner: o, seq: w.jobSeq}
	w.jobSeq++
	w.pending[f.key] = j
	w.queue = append(w.queue, j)
	w.workReady.Signal()
}

// next takes the job to run next from the queue, which is not empty: the
// files of root or of this mount namespace first, then those of the owner
// that holds the fewest files, then the oldest. A user who maps thousands
// of copies waits behind everyone else's files, not they behind his.
// w.mu is held.
func (w *Watch) next() *job {
	best := 0
	for i, j := range w.queue[1:] {
		if w.runsBefore(j, w.queue[best]) {
			best = i + 1
		}
	}
	j := w.queue[best]
	w.queue = append(w.queue[:best], w.queue[best+1:]...)
	return j
}

func (w *Watch) runsBefore(a, b *job) bool {
	if a.owner.trusted() != b.owner.trusted() {
		return a.owner.trusted()
	}
	if na, nb := w.budget.held(a.owner), w.budget.held(b.owner); na != nb {
		return na < nb
	}
	return a.seq < b.seq
}

// work is a worker: it attaches queued files until the watch closes.
func (w *Watch) work() {
	defer w.workers.Done()
	w.mu.Lock()
	defer w.mu.Unlock()
	for {
		for len(w.queue) == 0 && !w.stopping {
			w.workReady.Wait()
		}
		if w.stopping {
			return
		}
		j := w.next()
		w.mu.Unlock()
		if testAttaching != nil {
			testAttaching(j.path)
		}
		if j.old != nil {
			a, err := w.update(j)
			w.mu.Lock()
			w.finishUpdate(j, a, err)
		} else {
			a, err := w.attach(j)
			w.mu.Lock()
			w.finish(j, a, err)
		}
		delete(w.pending, j.f.key)
		w.settled.Broadcast()
	}
}

// finish takes a worker's result for j: a attached, or err. w.mu is held.
func (w *Watch) finish(j *job, a *attached, err error) {
	f := j.f
	if err == nil {
		err = w.budget.fit(j.owner, a.nfds, j.path, j.pid)
		if err != nil {
			w.release(a)
			w.closeLater(a)
		}
	}
	if err != nil {
		w.budget.dropped(j.owner)
		news := true
		if errors.Is(err, fs.ErrNotExist) {
			w.tr.forget(f) // not reached: tried again when mapped again
		} else {
			news = w.failed(f, err)
		}
		if news {
			w.report(Report{What: Skipped, Path: j.path, PID: j.pid, HostPath: j.hostPath, File: f.key.id(), Err: err})
		}
		if len(f.users) == 0 {
			w.idle(f)
		}
		return
	}
	a.owner = j.owner
	w.budget.attached(j.owner, a.nfds)
	delete(w.failures, f.key)
	w.files[f.key] = a
	if w.unpinned && w.opts.PinDir != "" {
		a.link.Unpin() // Unpin ran while it was being pinned
	}
	w.report(Report{What: Attached, Path: j.path, PID: j.pid, HostPath: j.hostPath, File: f.key.id(), BuildID: a.buildID, Sites: w.sites(a),
		LeftOut: append(a.plan.LeftOut(), a.link.LeftOut()...), Reused: a.reused})
	if len(f.users) == 0 {
		w.idle(f) // its processes exited while it was attached
	}
}

// settle waits until no file is pending. w.mu is held.
func (w *Watch) settle() {
	for len(w.pending) > 0 {
		w.settled.Wait()
	}
}

// stopWorkers drops the queue and waits for the workers to finish the
// files they hold, which they put in w.files as always.
func (w *Watch) stopWorkers() {
	w.mu.Lock()
	w.stopping = true
	for _, j := range w.queue {
		delete(w.pending, j.f.key)
		w.budget.dropped(j.owner)
	}
	w.queue = nil
	w.workReady.Broadcast()
	w.mu.Unlock()
	w.workers.Wait()
}

// closeLater closes a, which is no file's any more, off the lock: closing
// a link waits out the kernel's grace period for uprobes.
func (w *Watch) closeLater(a *attached) {
	w.closing.Add(1)
	go func() {
		defer w.closing.Done()
		a.close()
	}()
}
