package watch

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/multiprobe/multiprobe"
)

// Bringing links taken back from pins to this Watch's probes and program.
//
// A Watch with a PinDir takes back the links an earlier one pinned as
// they were: their sites and their program. When the earlier one had
// other probes (an agent restarted with a changed config) or another
// program (an upgraded agent), those links would count what the old
// config asked for, with the old code, for as long as their files live.
// So when a process first maps a file taken back (its path is known only
// then), the watch compares the link with what it would attach there:
// the probes, by kind and patterns, and the program, by the kernel's tag
// (multiprobe.Link.Runs). Where they differ, a worker resolves the file
// for this Watch's probes and compares the sites too (a probe that
// matches nothing in the file has none, so the probes alone would make
// every restart an update), and where those differ as well, or the
// program does, moves the link to them: Link.UpdateProgram where the link
// has the generation check (Options.Plan.Updatable), else a new link
// attached and pinned before the old one is closed. A file none of this
// Watch's probes target any more is detached.

// reconcile starts bringing a, a file taken back from a pin that process
// pid now maps, to this Watch's probes and program, if it runs others.
// w.mu is held.
func (w *Watch) reconcile(a *attached, pid int) {
	f := a.f
	if w.pending[f.key] != nil || w.stopping {
		return
	}
	var want []string
	for i, p := range w.probes {
		if w.matches(i, f.path) {
			want = append(want, probeKey(&p))
		}
	}
	if len(want) == 0 {
		w.detach(a) // no probe of this Watch targets it
		return
	}
	if a.link.Runs(w.prog) && sameKeys(want, linkProbes(a.link)) {
		return
	}
	w.budget.queued(a.owner)
	j := &job{f: f, path: f.path, hostPath: f.hostPath, hostDev: f.hostDev, hostIno: f.hostIno, pid: pid, owner: a.owner, seq: w.jobSeq, old: a}
	w.jobSeq++
	w.pending[f.key] = j
	w.queue = append(w.queue, j)
	w.workReady.Signal()
}

// probeKey is what a probe is compared by: its kind and patterns; its
// target is the file.
func probeKey(p *multiprobe.Probe) string {
	return fmt.Sprintf("%d %s", p.Kind, strings.Join(p.Patterns, "\x00"))
}

// linkProbes are the keys of the probes of l's sites.
func linkProbes(l *multiprobe.Link) []string {
	var keys []string
	for _, s := range l.Sites() {
		keys = append(keys, probeKey(s.Probe))
	}
	return keys
}

// sameKeys reports whether a and b hold the same keys, however often.
func sameKeys(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(slices.Compact(a), slices.Compact(b))
}

// siteKeys are what sites are compared by: probe, name, offset, and
// ref-counter offset; not the cookie or the path.
func siteKeys(sites []multiprobe.Site) []string {
	keys := make([]string, len(sites))
	for i, s := range sites {
		keys[i] = fmt.Sprintf("%s %s %d %d %v", probeKey(s.Probe), s.Name, s.Offset, s.RefCtrOffset, s.Returns)
	}
	slices.Sort(keys)
	return keys
}

// update resolves j's file for this Watch's probes and moves j.old's link
// to them and to the Watch's program (see above). It returns nil, nil
// where the link runs them already. It runs on a worker, with no lock
// held; j.old stays the file's until finishUpdate.
func (w *Watch) update(j *job) (_ *attached, err error) {
	old := j.old
	a := &attached{f: j.f}
	defer func() {
		if err != nil {
			w.release(a)
			if a.link == old.link {
				a.link = nil // still old's
			}
			a.close()
		}
	}()
	if err := w.resolve(a, j); err != nil {
		return nil, err
	}
	if old.link.Runs(w.prog) && slices.Equal(siteKeys(old.link.Sites()), siteKeys(a.plan.Sites())) {
		w.release(a)
		a.close()
		return nil, nil
	}
	w.resolved(Updated, j, a)
	err = old.link.UpdateProgram(a.plan, w.prog)
	switch {
	case err == nil:
		a.link = old.link
	case errors.Is(err, multiprobe.ErrNotUpdatable):
		// Make before break: the old link counts until the new one
		// does, and both for a moment.
		if a.link, err = a.plan.Attach(w.prog); err != nil {
			return nil, err
		}
		if w.opts.PinDir != "" {
			// Its pins are where the new link's go; it stays attached
			// until finishUpdate closes it.
			if err := old.link.Unpin(); err != nil {
				return nil, err
			}
			if err := w.pin(a); err != nil {
				return nil, err
			}
		}
	case old.link.Runs(w.prog):
		// Switched, but something after failed (removing the old
		// set's pins): the link is the new set's, as the error says.
		a.link = old.link
		a.nfds = a.fds()
		return a, err
	default:
		return nil, err
	}
	a.nfds = a.fds()
	return a, nil
}

// finishUpdate takes a worker's result for j, an update: a in place of
// j.old, nil for nothing to change, or err, which leaves j.old as it
// was. w.mu is held.
func (w *Watch) finishUpdate(j *job, a *attached, err error) {
	old := j.old
	if a == nil {
		w.budget.dropped(j.owner)
		if err != nil {
			w.report(Report{What: Skipped, Path: j.path, PID: j.pid, HostPath: j.hostPath, File: j.f.key.id(), Err: fmt.Errorf("bringing the link taken back from its pin to this watch's probes: %w", err)})
		}
		return
	}
	w.budget.detached(old.owner, old.nfds)
	a.owner = old.owner
	w.budget.attached(a.owner, a.nfds)
	if a.link == old.link {
		old.link = nil // a's now
	}
	w.closeLater(old)
	w.files[j.f.key] = a
	if w.unpinned && w.opts.PinDir != "" {
		a.link.Unpin() // Unpin ran while it was being updated
	}
	w.report(Report{What: Updated, Path: j.path, PID: j.pid, HostPath: j.hostPath, File: j.f.key.id(), BuildID: a.buildID, Sites: w.sites(a),
		LeftOut: append(a.plan.LeftOut(), a.link.LeftOut()...), Reused: a.reused, Err: err})
	if len(j.f.users) == 0 {
		w.idle(j.f)
	}
}
