package fallback

import (
	"sync"
	"sync/atomic"
	"time"
)

// Phases that Options.Progress reports.
const (
	PhaseAttach = "attach"
	PhaseDetach = "detach"
)

// progressEvery is how often a long phase reports its progress: often
// enough for a counter on a terminal, rarely enough to cost nothing next
// to a per-site attach (about 40 ms each on the perf-event path).
const progressEvery = 100 * time.Millisecond

// progress counts the sites a phase has done and reports them to fn, from
// a goroutine of its own, every progressEvery and once at the end; fn is
// never called concurrently with itself. A nil fn costs one atomic add a
// site.
type progress struct {
	fn          func(phase string, done, total int)
	phase       string
	total       int
	done        atomic.Int64
	stop, ended chan struct{}
	once        sync.Once
}

func startProgress(fn func(phase string, done, total int), phase string, total int) *progress {
	p := &progress{fn: fn, phase: phase, total: total}
	if fn == nil {
		return p
	}
	p.stop, p.ended = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(p.ended)
		t := time.NewTicker(progressEvery)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				p.fn(p.phase, int(p.done.Load()), p.total)
			case <-p.stop:
				return
			}
		}
	}()
	return p
}

func (p *progress) add(n int) { p.done.Add(int64(n)) }

// end reports the phase's last count, once the reporting goroutine has
// stopped.
func (p *progress) end() {
	if p.fn == nil {
		return
	}
	p.once.Do(func() {
		close(p.stop)
		<-p.ended
		p.fn(p.phase, int(p.done.Load()), p.total)
	})
}
