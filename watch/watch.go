package watch

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/elfsym"
	"github.com/multiprobe/multiprobe/internal/fds"
)

// Options change what a Watch does. A nil *Options is the zero value.
type Options struct {
	// Plan is what each file's sites are resolved with (see
	// multiprobe.Options); PID must be 0: a watch is for every process
	// (PIDs, a Link's own filter, may narrow it).
	Plan multiprobe.Options
	// PinDir, if not "", is a directory on a BPF file system where each
	// file's link is pinned (multiprobe.Link.Pin), a directory per file.
	// New takes back the links pinned there by an earlier Watch, a
	// process that ran before this one, and Close leaves them pinned: an
	// agent that restarts, or is upgraded, misses no call in between.
	// A link taken back runs the sites and program it was attached with
	// until a process maps its file, when it is brought to this Watch's
	// probes and program if they differ (see Updated); one that none of
	// this Watch's probes targets is detached at New. Pin the maps the
	// programs of two versions share (cilium/ebpf's MapOptions.PinPath),
	// and give both Watches Plan.Updatable, so that no call is counted
	// twice. Unpin, then Close, detaches everything.
	PinDir string
	// MaxFiles bounds the files the watch holds attached, or is
	// attaching, at once (default 10,000), and MaxFDs the file
	// descriptors they hold (default half this process's limit,
	// RLIMIT_NOFILE). A user other than root and a mount namespace
	// other than this process's may each hold an eighth of either, and
	// all of them together three quarters: root's files in this root
	// always fit. A file past a budget is Skipped with an error
	// wrapping ErrBudget and tried again later, as any skipped file.
	MaxFiles, MaxFDs int
	// Resolved, if not nil, is told each file's sites, with their
	// cookies, after they are resolved and before they are attached: a
	// Report that says Attached or Updated, as the one that follows it
	// will, but for LeftOut, which says only what Resolve left out. It
	// is called from the workers that attach files, possibly at once,
	// and the attach waits for it: a program that looks its sites up by
	// cookie, in a map the caller fills from here, finds them from their
	// first call. It must not call the Watch's methods.
	Resolved func(Report)
	// Report, if not nil, is told what the watch does with each file, one
	// report at a time, from the watch's goroutines: it must not call the
	// Watch's methods.
	Report func(Report)
}

// What a Report says happened.
type What int

const (
	// Attached: the file's sites are attached.
	Attached What = iota + 1
	// Detached: the file's last process exited and the file was unlinked
	// (an upgrade replaced it), so its link is closed; or, taken back
	// from a pin, none of the Watch's probes targets it.
	Detached
	// Skipped: the file matched a probe's target but could not be
	// attached; Err says why. It is tried again when it changes, or while
	// a process maps it after a backoff (1 s, doubling to 5 min), and said
	// again only for another reason. A file the watch could not reach (its
	// process exited first: an error wrapping fs.ErrNotExist) is tried
	// again at its next mapping.
	Skipped
	// Restored: the file's link was pinned by an earlier Watch under
	// Options.PinDir, and taken back.
	Restored
	// Updated: a file's link taken back from a pin (Restored) ran
	// other sites or another program than this Watch's probes and
	// program, and now runs this Watch's (Sites), changed as its first
	// process mapped it. Where the link has the generation check
	// (Options.Plan.Updatable, in the Watch that attached it and in this
	// one) the change is multiprobe.Link.UpdateProgram's: no call missed
	// or counted twice. Otherwise a new link is attached before the old
	// one is closed: no call is missed, but one made in between may be
	// counted by both.
	Updated
	// Rescanned: the watch could not read an event (Err says why: a
	// malformed record, a read error), so it read every process's
	// mappings again, as after events the kernel had no room for, and
	// goes on. Path and PID are empty.
	Rescanned
)

func (w What) String() string {
	switch w {
	case Attached:
		return "attached"
	case Detached:
		return "detached"
	case Skipped:
		return "skipped"
	case Restored:
		return "restored"
	case Updated:
		return "updated"
	case Rescanned:
		return "rescanned"
	}
	return fmt.Sprintf("What(%d)", int(w))
}

// Report says what a Watch did with one file.
type Report struct {
	What What
	// Path is the file as the process that mapped it names it, in its own
	// mount namespace; PID is that process.
	Path string
	PID  int
	// HostPath is the file as this process reaches it (through the
	// mapping process's root, /proc/PID/root/..., where that is not this
	// one), and File is the file the kernel maps, where its uprobes go:
	// two copies of one path in two containers differ there. Both are
	// empty for a file taken back from a pin that no process mapped yet.
	HostPath string
	File     FileID
	// BuildID is the file's GNU build ID in hex, "" if it has none
	// (Attached).
	BuildID string
	// Processes is how many processes mapped the file while it was
	// attached (Detached).
	Processes int
	// Sites are the file's sites (Attached, Restored, Updated), with their cookies; each
	// site's Probe is the probe as given to New, its Target as given.
	Sites []multiprobe.Site
	// LeftOut are the file's sites that its probes' globs selected and
	// that are not attached (Attached), each with its reason: left out by
	// Resolve (multiprobe.Plan.LeftOut) or refused by the kernel at
	// attach (multiprobe.Link.LeftOut: another tracer's uprobe there).
	LeftOut []multiprobe.Site
	// Reused says the file's sites were not resolved again: it is a copy
	// of a file attached already (the same build ID, the same library in
	// another container), whose plan was retargeted to it.
	Reused bool
	// Err is why the file was skipped, or what went wrong detaching it.
	Err error
}

// FileID is a file as the kernel knows it: its device and inode.
type FileID struct {
	Major, Minor uint32
	Inode        uint64
}

// String writes the file as /proc/PID/maps does: "fe:00 1234".
func (id FileID) String() string { return fmt.Sprintf("%02x:%02x %d", id.Major, id.Minor, id.Inode) }

// A Watch attaches a program to the sites of probe specs in every file
// that matches their targets, in any process and mount namespace, as the
// files are mapped: at New for what runs already and for the files the
// targets name in this process's root (the watch maps those itself,
// executable and never run, so that a program that starts later runs them
// probed from its first instruction), and later from the kernel's exec
// and mmap events, a millisecond or so after a file appears. A path
// target means the file its symbolic links lead to as well. A file is the inode the kernel maps,
// which is where a uprobe goes: containers of one image, each seeing the
// image's library through an overlay mount of its own, map one file, which
// is attached once and counts each call once. It is resolved and attached
// once, and detached when its last process has exited and it was
// unlinked. (Before Linux 6.1 the watch takes the device and inode that
// /proc/PID/maps shows, which on those kernels are the mapped file's too.)
//
// Copies of one build (the same GNU build ID: one library version in many
// containers) are resolved once and share their sites' cookies, so that a
// program counting by cookie counts a function over all of them. Each
// build has a range of cookies of its own (multiprobe.Options.CookieBase),
// the first from Options.Plan.CookieBase on, the next after it, so that
// no two builds share a key of a per-site map; Report.Sites says which
// site each cookie is. A build keeps its range for the Watch's life, also
// when its copies come and go; a file without a build ID gets a new range
// each time it appears.
//
// Files are resolved and attached by a few workers, off the goroutine
// that reads the kernel's events: a slow file (a large binary, a hostile
// one) holds back neither the others nor the Watch's methods. New returns
// when what ran at its start is attached or skipped.
//
// A Watch's methods may be called from any goroutine, at once: Files and
// Unpin at any time, also while files are being attached or detached,
// and Close more than once, also concurrently with the others (which
// after it see no files). The Links Files hands out are the Watch's: read
// them (their methods are safe concurrently, see multiprobe.Link), and do
// not close, update or unpin them.
type Watch struct {
	probes []multiprobe.Probe
	// targets are, by probe, the spellings of its target (see spellings).
	targets [][]string
	seeds   []*seed
	spec    *ebpf.CollectionSpec
	prog    *ebpf.Program
	opts    Options
	src     *source
	tr      *tracker
	done    chan struct{} // closed when the loop has returned
	// quit ends rescan (and a pause of the loop); rescanned is done when
	// rescan has returned.
	quit      chan struct{}
	rescanned sync.WaitGroup
	closeOnce sync.Once

	mu    sync.Mutex
	files map[fileKey]*attached
	// failures are the files that could not be attached (see failed.go).
	failures map[fileKey]*failure
	failSeq  uint64
	// The files being attached (see work.go): pending by key, queue the
	// ones no worker has taken yet; workReady is signalled when one is
	// queued or the watch stops, settled when a worker is done with one.
	pending   map[fileKey]*job
	queue     []*job
	jobSeq    uint64
	workReady *sync.Cond
	settled   *sync.Cond
	stopping  bool // Close: no more jobs
	unpinned  bool // Unpin: a file attached from here on is unpinned too
	workers   sync.WaitGroup
	budget    *budget

	// planMu makes the resolves take turns, so that each new build's
	// cookie range starts where the last one's ended (see plan);
	// buildMu guards what the builds share.
	planMu    sync.Mutex
	buildMu   sync.Mutex
	prepareMu sync.Mutex // Plan.Prepare edits w.spec
	builds    map[string]*build
	// bases are the builds' cookie ranges, kept after their files are
	// gone (a few bytes a build) so that a build seen again counts where
	// it did; nextCookie is where the next build's start.
	bases      map[string]uint64
	nextCookie uint64

	closing  sync.WaitGroup // files being detached
	reportMu sync.Mutex     // one Report at a time
}

// attached is one file's plan and link, and the file held open, which
// tells whether it was unlinked.
type attached struct {
	f    *tracked
	file *os.File
	plan *multiprobe.Plan
	link *multiprobe.Link
	// build keys the file's build (see build), "" if it has no build ID
	// (buildID, in hex); reused says its plan was retargeted from another
	// copy's.
	build, buildID string
	reused         bool
	// owner is whose budget it counts against, nfds how many file
	// descriptors it holds there.
	owner owner
	nfds  int
	// counted says a counts in its build's files (see release).
	counted bool
}

// New starts watching. spec is the collection prog was loaded from, after
// multiprobe.PrepareSpec with opts.Plan: each file's plan prepares it
// again before it attaches prog. Close the Watch to detach everything.
func New(probes []multiprobe.Probe, spec *ebpf.CollectionSpec, prog *ebpf.Program, opts *Options) (*Watch, error) {
	if opts == nil {
		opts = &Options{}
	}
	switch {
	case len(probes) == 0:
		return nil, fmt.Errorf("watch: no probes: %w", multiprobe.ErrBadSpec)
	case spec == nil || prog == nil:
		return nil, errors.New("watch: nil spec or program")
	case opts.Plan.PID != 0:
		return nil, fmt.Errorf("watch: Options.Plan.PID %d: a watch is for every process; filter with PIDs", opts.Plan.PID)
	}
	if opts.PinDir != "" {
		// Here, not at the first file's Pin, which would fail for
		// every file.
		if err := multiprobe.CheckPinDir(opts.PinDir); err != nil {
			return nil, fmt.Errorf("watch: Options.PinDir: %w", err)
		}
	}
	src, err := newSource()
	if err != nil {
		return nil, err
	}
	w := &Watch{probes: slices.Clone(probes), spec: spec, prog: prog, opts: *opts, src: src, done: make(chan struct{}), quit: make(chan struct{}),
		files: map[fileKey]*attached{}, builds: map[string]*build{}, bases: map[string]uint64{}, failures: map[fileKey]*failure{}, pending: map[fileKey]*job{},
		nextCookie: opts.Plan.CookieBase, budget: newBudget(opts.MaxFiles, opts.MaxFDs)}
	w.workReady = sync.NewCond(&w.mu)
	w.settled = sync.NewCond(&w.mu)
	w.workers.Add(workers)
	for range workers {
		go w.work()
	}
	for _, p := range w.probes {
		w.targets = append(w.targets, spellings(p.Target))
	}
	w.tr = newTracker(w.match, w.appeared, w.idle)
	w.tr.reached = w.reached
	w.tr.again = w.again
	if src.vmas != nil {
		w.tr.real = func(pid int) (map[uint64]fileKey, error) { return fileVMAs(src.vmas, pid) }
	}
	// The events program runs from here on, so a process that starts
	// during the scan is seen by one or the other, or both, which the
	// tracker takes as one.
	w.mu.Lock()
	var stale []*attached
	if opts.PinDir != "" {
		if stale, err = w.restore(); err != nil {
			w.mu.Unlock()
			w.stopWorkers()
			src.Close()
			return nil, err
		}
	}
	w.seed()
	w.tr.scan()
	// What runs now is attached when New returns.
	w.settle()
	for _, a := range stale {
		if len(a.f.users) == 0 {
			w.detach(a) // its file was deleted while no Watch ran
		}
	}
	// The seeds did their work: their files are attached (or taken back,
	// which the seeds' mapping told from a file gone), and a program
	// started from here on runs them probed. Kept mapped, they would
	// keep this process a user of a file an upgrade replaces, and the
	// old file attached for the Watch's life.
	if len(w.seeds) > 0 {
		closeSeeds(w.seeds)
		w.tr.remapped(os.Getpid())
	}
	w.mu.Unlock()
	go w.loop()
	w.rescanned.Add(1)
	go w.rescan(time.Second)
	return w, nil
}

// loop handles the events until Close. An event it cannot read ends
// nothing: it says so, reads /proc again for what it may have missed, and
// goes on, after a pause if reads keep failing.
func (w *Watch) loop() {
	defer close(w.done)
	pause := time.Duration(0)
	var batch []event
	for {
		e, err := w.src.read()
		if err == nil {
			// The rest of a burst, handled together (see
			// tracker.handleAll); an error in it is handled after.
			batch, err = w.src.readMore(append(batch[:0], e), maxBatch)
			pause = 0
			w.mu.Lock()
			w.tr.handleAll(batch)
			if slices.ContainsFunc(batch, func(e event) bool { return e.Kind == eventExit }) {
				w.sweep()
			}
			w.mu.Unlock()
		}
		if errors.Is(err, os.ErrClosed) {
			return // Close
		}
		if err != nil {
			w.report(Report{What: Rescanned, Err: err})
			w.mu.Lock()
			w.tr.rescan()
			w.sweep()
			w.mu.Unlock()
			pause = min(max(2*pause, time.Millisecond), time.Second)
			select {
			case <-w.quit:
				return
			case <-time.After(pause):
			}
		}
	}
}

// maxBatch bounds the events handled under one hold of the lock.
const maxBatch = 1024

// rescan looks, every period, whether the kernel lost events (the ring
// buffer was full: a burst of 65,000 execs and mappings), and if it did,
// reads /proc again: the mappings of processes it missed, and the exits
// (processes tracked that are gone).
func (w *Watch) rescan(period time.Duration) {
	defer w.rescanned.Done()
	t := time.NewTicker(period)
	defer t.Stop()
	var lost uint64
	for {
		select {
		case <-w.quit:
			return
		case <-t.C:
		}
		if n := w.src.lost(); n != lost {
			lost = n
			w.mu.Lock()
			w.tr.rescan()
			w.sweep()
			w.mu.Unlock()
		}
		w.mu.Lock()
		w.retryFailed()
		w.mu.Unlock()
	}
}

func (w *Watch) match(path string) bool {
	for i := range w.probes {
		if w.matches(i, path) {
			return true
		}
	}
	return false
}

// matches reports whether a file at path (as a process names it) is what
// probe i's target means.
func (w *Watch) matches(i int, path string) bool {
	return slices.ContainsFunc(w.targets[i], func(t string) bool { return matchTarget(t, path) })
}

func (w *Watch) report(r Report) {
	if w.opts.Report != nil {
		w.reportMu.Lock()
		defer w.reportMu.Unlock()
		w.opts.Report(r)
	}
}

// seed maps the files the targets name in this root into this process,
// where the scan finds them (see seed).
func (w *Watch) seed() {
	targets := make([]string, len(w.probes))
	for i, p := range w.probes {
		targets[i] = p.Target
	}
	seen := map[string]bool{}
	for _, path := range seedFiles(targets) {
		if seen[path] {
			continue
		}
		seen[path] = true
		s, err := mapSeed(path)
		if err != nil {
			w.report(Report{What: Skipped, Path: path, PID: os.Getpid(), Err: err})
			continue
		}
		w.seeds = append(w.seeds, s)
	}
}

// appeared queues f, mapped by process pid, for a worker to resolve and
// attach the probes whose target it matches (see work.go), unless it
// failed before and is as it was then (see failed.go).
func (w *Watch) appeared(f *tracked, pid int) {
	if w.due(f) {
		w.enqueue(f, pid)
	}
}

// attach resolves and attaches the probes whose target j's file matches,
// in the file as j's process reaches it. It runs on a worker, with no
// lock held.
func (w *Watch) attach(j *job) (_ *attached, err error) {
	a := &attached{f: j.f}
	defer func() {
		if err != nil {
			w.release(a)
			a.close()
		}
	}()
	if err := w.resolve(a, j); err != nil {
		return nil, err
	}
	w.resolved(Attached, j, a)
	if a.link, err = a.plan.Attach(w.prog); err != nil {
		return nil, err
	}
	if err := w.pin(a); err != nil {
		return nil, err
	}
	a.nfds = a.fds()
	return a, nil
}

// resolved tells Options.Resolved of a's sites, which are about to be
// attached for j (what: Attached or Updated).
func (w *Watch) resolved(what What, j *job, a *attached) {
	if w.opts.Resolved == nil {
		return
	}
	w.opts.Resolved(Report{What: what, Path: j.path, PID: j.pid, HostPath: j.hostPath, File: j.f.key.id(), BuildID: a.buildID,
		Sites: w.given(a.plan.Sites(), j.path), LeftOut: a.plan.LeftOut(), Reused: a.reused})
}

// resolve opens j's file for a and gives a its plan, prepared, for the
// probes whose target the file matches.
func (w *Watch) resolve(a *attached, j *job) (err error) {
	var probes []multiprobe.Probe
	var which []string
	for i, p := range w.probes {
		if w.matches(i, j.path) {
			p.Target = j.hostPath
			probes = append(probes, p)
			which = append(which, strconv.Itoa(i))
		}
	}
	// Not os.Open: a process can put a FIFO where its file was, which
	// would block the open, and the worker with it.
	if a.file, err = fds.OpenRegular(j.hostPath); err != nil {
		return err
	}
	// The file mapped, not one put at its path since it was found.
	var st unix.Stat_t
	if err := unix.Fstat(int(a.file.Fd()), &st); err != nil {
		return fmt.Errorf("%s: %w", j.hostPath, err)
	}
	if j.hostIno != 0 && (uint64(st.Dev) != j.hostDev || st.Ino != j.hostIno) {
		return fmt.Errorf("%s: %w: replaced since process %d mapped it", j.hostPath, fs.ErrNotExist, j.pid)
	}
	if a.buildID = buildID(a.file); a.buildID != "" {
		a.build = a.buildID + " " + strings.Join(which, ",")
	}
	if err := w.plan(a, j.hostPath, probes); err != nil {
		return err
	}
	// Prepare writes the spec the workers share.
	w.prepareMu.Lock()
	defer w.prepareMu.Unlock()
	return a.plan.Prepare(w.spec)
}

// fds is how many file descriptors a holds: the file, its plan's (one
// file: every probe targets it) and its link's.
func (a *attached) fds() int {
	n := 0
	if a.file != nil {
		n++
	}
	if a.plan != nil {
		n++
	}
	if a.link != nil {
		n += a.link.NumFDs()
	}
	return n
}

// plan gives a its plan: its build's, retargeted to hostPath, where a copy
// of the build is attached or being attached (copies of one library in
// many containers are resolved once), else probes resolved, with the
// build's cookie range or the next one; a counts as a file of its build
// from here on (see release).
func (w *Watch) plan(a *attached, hostPath string, probes []multiprobe.Probe) (err error) {
	// One at a time: a build's range starts where the last one ended,
	// which is known when that one is resolved, and a second copy of a
	// build waits to be retargeted from the first.
	w.planMu.Lock()
	defer w.planMu.Unlock()
	w.buildMu.Lock()
	b := w.builds[a.build]
	base, known := w.bases[a.build]
	if !known || a.build == "" {
		base = w.nextCookie
	}
	w.buildMu.Unlock()
	if b != nil {
		if a.plan, err = b.plan.Retarget(hostPath); err == nil {
			a.reused = true
			w.buildMu.Lock()
			b.files++
			a.counted = true
			w.buildMu.Unlock()
			return nil
		}
	}
	opts := w.opts.Plan
	opts.CookieBase = base
	if a.plan, err = multiprobe.Resolve(probes, &opts); err != nil {
		return err
	}
	w.buildMu.Lock()
	defer w.buildMu.Unlock()
	if !known || a.build == "" {
		w.nextCookie += uint64(a.plan.Len())
		if a.build != "" {
			w.bases[a.build] = base
		}
	}
	if a.build != "" {
		if b = w.builds[a.build]; b == nil {
			b = &build{plan: a.plan}
			w.builds[a.build] = b
		}
		b.files++
		a.counted = true
	}
	return nil
}

// sites returns a's sites, each naming the probe as it was given to New
// (see given).
func (w *Watch) sites(a *attached) []multiprobe.Site {
	return w.given(a.plan.Sites(), a.f.path)
}

// given makes each of sites name the probe as it was given to New, its
// Target as given, where a plan's probes target the file itself (through
// this process's view of it): by kind and patterns among the probes whose
// target path (as a process names the file; "" for any) matches.
func (w *Watch) given(sites []multiprobe.Site, path string) []multiprobe.Site {
	given := map[*multiprobe.Probe]*multiprobe.Probe{}
	for i := range sites {
		p := sites[i].Probe
		if g, ok := given[p]; ok {
			sites[i].Probe = g
			continue
		}
		for j, q := range w.probes {
			if q.Kind == p.Kind && slices.Equal(q.Patterns, p.Patterns) && (path == "" || w.matches(j, path)) {
				c := q
				c.Patterns = slices.Clone(q.Patterns)
				given[p] = &c
				sites[i].Probe = &c
				break
			}
		}
	}
	return sites
}

// buildID returns f's GNU build ID in hex, or "" if it has none.
func buildID(f *os.File) string {
	ef, err := elfsym.OpenFile(f)
	if err != nil {
		return ""
	}
	defer ef.Close()
	return hex.EncodeToString(ef.BuildID())
}

// build is one build of a file (a build ID, and the probes that match its
// name) and the plan its first copy was resolved to, which its other copies
// are retargeted from while any copy is attached.
type build struct {
	plan  *multiprobe.Plan // closed with its own copy; Retarget needs it not open
	files int
}

// release is a's build losing a's file.
func (w *Watch) release(a *attached) {
	w.buildMu.Lock()
	defer w.buildMu.Unlock()
	if !a.counted {
		return
	}
	a.counted = false
	if b := w.builds[a.build]; b != nil {
		if b.files--; b.files == 0 {
			delete(w.builds, a.build)
		}
	}
}

func (a *attached) close() error {
	var errs []error
	if a.link != nil {
		errs = append(errs, a.link.Close())
	}
	if a.plan != nil {
		errs = append(errs, a.plan.Close())
	}
	if a.file != nil {
		errs = append(errs, a.file.Close())
	}
	return errors.Join(errs...)
}

// idle is a file whose last process exited: detached if it is unlinked.
func (w *Watch) idle(f *tracked) {
	if w.pending[f.key] != nil {
		return // its worker looks when it is done
	}
	a := w.files[f.key]
	if a == nil {
		if w.failures[f.key] != nil {
			w.tr.forget(f) // its failure is remembered without it
		}
		return
	}
	if a.file == nil {
		return // taken back from a pin, and no process opened it since
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(a.file.Fd()), &st); err != nil || st.Nlink > 0 {
		return // a later process may map it: its uprobes wait there
	}
	w.detach(a)
}

// reached is a file taken back from a pin, mapped by process pid now:
// held open from here on, which tells when it is unlinked, and brought to
// this Watch's probes and program where its link runs others (see
// update.go).
func (w *Watch) reached(f *tracked, pid int) {
	a := w.files[f.key]
	if a == nil || a.file != nil {
		return
	}
	a.file, _ = fds.OpenRegular(f.hostPath)
	w.reconcile(a, pid)
}

// detach closes a's link (unpinned first) and forgets its file.
func (w *Watch) detach(a *attached) {
	f := a.f
	delete(w.files, f.key)
	w.tr.forget(f)
	w.release(a)
	w.budget.detached(a.owner, a.nfds)
	var unpinned error
	if w.opts.PinDir != "" {
		unpinned = a.link.Unpin() // else Close would leave it attached
	}
	// Closing a link waits out the kernel's grace period for uprobes,
	// tens of milliseconds: not in the event loop, which would hold back
	// the next file's attach as long.
	w.closing.Add(1)
	go func() {
		defer w.closing.Done()
		w.report(Report{What: Detached, Path: f.path, HostPath: f.hostPath, File: f.key.id(), Processes: f.mapped, Err: errors.Join(unpinned, a.close())})
	}()
}

// sweep detaches the idle files unlinked since they went idle.
func (w *Watch) sweep() {
	for _, a := range w.files {
		if len(a.f.users) == 0 {
			w.idle(a.f)
		}
	}
}

// File is a file a Watch has attached.
type File struct {
	// Path is the file as the first process that mapped it names it;
	// ID is the file the kernel maps (see Report.File).
	Path string
	ID   FileID
	// Users is how many processes map it now, Processes how many mapped
	// it since it was attached.
	Users, Processes int
	// Link is its link: read its Sites, do not close it.
	Link *multiprobe.Link
}

// Files returns the files attached now, by path; a file being attached
// is not among them until its Attached report.
func (w *Watch) Files() []File {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]File, 0, len(w.files))
	for _, a := range w.files {
		out = append(out, File{Path: a.f.path, ID: a.f.key.id(), Users: len(a.f.users), Processes: a.f.mapped, Link: a.link})
	}
	slices.SortFunc(out, func(a, b File) int {
		switch {
		case a.Path < b.Path:
			return -1
		case a.Path > b.Path:
			return 1
		}
		return 0
	})
	return out
}

// Close stops the watch and detaches every file. It may be called more
// than once, also concurrently; later calls return nil.
func (w *Watch) Close() error {
	first := false
	w.closeOnce.Do(func() { first = true })
	if !first {
		return nil
	}
	close(w.quit)
	// The loop first: it may be using the iterator.
	err := w.src.stop()
	<-w.done
	w.rescanned.Wait()
	err = errors.Join(err, w.src.Close())
	w.stopWorkers()
	w.mu.Lock()
	defer w.mu.Unlock()
	// Each close waits out a grace period: all at once.
	errs := make([]error, 1, 1+len(w.files))
	errs[0] = err
	var mu sync.Mutex
	for k, a := range w.files {
		w.release(a)
		w.budget.detached(a.owner, a.nfds)
		delete(w.files, k)
		w.closing.Add(1)
		go func() {
			defer w.closing.Done()
			err := a.close()
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}()
	}
	w.closing.Wait()
	errs = append(errs, closeSeeds(w.seeds))
	return errors.Join(errs...)
}
