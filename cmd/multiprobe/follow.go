package main

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cilium/ebpf"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/elfsym"
	"github.com/multiprobe/multiprobe/watch"
)

// followSlots is how many sites a following count has slots for: its
// counts array, 2 MiB, is sized before any file is found. A build's sites
// past it are attached but not counted, and said so.
const followSlots = 1 << 18

// following reports whether count traces every process: no command after
// "--" and no --pid. The probes then follow their targets into every
// process and container, now and as they appear (package watch).
func (f *traceFlags) following(command []string) bool {
	return len(command) == 0 && f.pid == 0
}

// follower is a watch's view for count: the sites of every file it
// attached, by cookie, and the files.
type follower struct {
	mu    sync.Mutex
	sites map[uint64]multiprobe.Site
	// files are the files attached, by the file the kernel maps, in the
	// order they were first attached: one entry a file however often it
	// is attached again.
	files  []*fileEntry
	fileAt map[watch.FileID]*fileEntry
	// leftOut are the sites left out of the files attached, each once by
	// file, kind and offset, the first maxFollowLeftOut of them.
	leftOut     []multiprobe.Site
	leftOutSeen map[leftOutKey]bool
	verbose     io.Writer // nil unless --verbose
	stderr      io.Writer
	warned      bool
	// skipped are the files that could not be attached, each said once
	// (by path and reason): a file is tried again at each mapping.
	skipped map[string]bool
	// rescans counts the events the watch could not read, the first
	// said (all of them with --verbose).
	rescans int
	// attached, if not nil, is told of each file's sites before they are
	// attached (watch.Options.Resolved), from the watch's workers.
	attached func(watch.Report)
}

// fileEntry is a file a follow run attached, as --json reports it.
type fileEntry struct {
	// Path is the file as the first process that mapped it names it (in
	// its own root), HostPath as this process reached it.
	Path     string `json:"path"`
	HostPath string `json:"host_path"`
	// Device ("major:minor") and Inode are the file the kernel maps,
	// which tells two copies of one path apart.
	Device  string `json:"device"`
	Inode   uint64 `json:"inode"`
	BuildID string `json:"build_id,omitempty"`
	// Sites is how many of its sites are attached.
	Sites int `json:"sites"`
	// Processes is how many processes mapped it while it was attached.
	Processes int `json:"processes"`
	// Attached is when it was last attached, Detached when it was
	// detached since (its last process exited and it was unlinked).
	Attached time.Time  `json:"attached"`
	Detached *time.Time `json:"detached,omitempty"`
}

// leftOutKey is a left-out site of a file.
type leftOutKey struct {
	file   watch.FileID
	kind   string
	offset uint64
}

// maxFollowLeftOut bounds the left-out sites a follow run keeps for its
// report, which a run of days over many builds would grow without end.
const maxFollowLeftOut = 10_000

// report takes in what the watch did with one file.
func (fl *follower) report(r watch.Report) {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	switch r.What {
	case watch.Attached:
		fe := fl.fileAt[r.File]
		if fe == nil {
			fe = &fileEntry{Path: r.Path, HostPath: r.HostPath, Device: fmt.Sprintf("%d:%d", r.File.Major, r.File.Minor), Inode: r.File.Inode, BuildID: r.BuildID}
			fl.fileAt[r.File] = fe
			fl.files = append(fl.files, fe)
		}
		fe.Sites = len(r.Sites) - len(r.LeftOut)
		fe.Attached, fe.Detached = time.Now().UTC(), nil
		for _, s := range r.LeftOut {
			k := leftOutKey{r.File, s.ProbeKind(), s.Offset}
			if !fl.leftOutSeen[k] && len(fl.leftOut) < maxFollowLeftOut {
				fl.leftOutSeen[k] = true
				fl.leftOut = append(fl.leftOut, s)
			}
		}
		// The sites the kernel refused at attach have a cookie and
		// count nothing: not sites of the report.
		type at struct {
			kind   multiprobe.Kind
			offset uint64
		}
		refused := map[at]bool{}
		for _, s := range r.LeftOut {
			refused[at{s.Probe.Kind, s.Offset}] = true
		}
		past := 0
		for _, s := range r.Sites {
			if refused[at{s.Probe.Kind, s.Offset}] {
				continue
			}
			if _, ok := fl.sites[s.Cookie]; !ok {
				fl.sites[s.Cookie] = s
			}
			if s.Cookie >= followSlots {
				past++
			}
		}
		if past > 0 && !fl.warned {
			fl.warned = true
			fmt.Fprintf(fl.stderr, "%d sites of %s are past the counter's %d slots and are not counted\n", past, r.Path, followSlots)
		}
		if fl.verbose != nil {
			how := ""
			if r.Reused {
				how = ", a copy of a build attached already"
			}
			fmt.Fprintf(fl.verbose, "attached %s (process %d, %s): %d %s%s\n", r.Path, r.PID, where(r), len(r.Sites), plural(len(r.Sites), "site", "sites"), how)
		}
	case watch.Skipped:
		// Not only with --verbose: a file that matched and could not be
		// attached is calls not counted. Once a file: it is tried again
		// at each mapping. A process gone before the watch reached its
		// file (ErrNotExist through its root) is no file refused: the
		// next process that maps it is another try, so that is said
		// only with -v.
		if errors.Is(r.Err, fs.ErrNotExist) && fl.verbose == nil {
			return
		}
		key := fmt.Sprint(r.File) + "\x00" + r.Path
		if !fl.skipped[key] {
			fl.skipped[key] = true
			fmt.Fprintf(fl.stderr, "skipped %s (process %d, %s): %v\n", r.Path, r.PID, where(r), r.Err)
		}
	case watch.Rescanned:
		if fl.rescans++; fl.rescans == 1 || fl.verbose != nil {
			fmt.Fprintf(fl.stderr, "the watch could not read an event (%v): it read every process's mappings again; calls made meanwhile in files it attached late are not counted\n", r.Err)
		}
	case watch.Detached:
		if fe := fl.fileAt[r.File]; fe != nil {
			t := time.Now().UTC()
			fe.Detached, fe.Processes = &t, r.Processes
		}
		if fl.verbose != nil {
			fmt.Fprintf(fl.verbose, "detached %s (%s)\n", r.Path, where(r))
		}
	}
}

// where says which file a report is of: its device and inode, and the
// root the process that mapped it sees it in ("/" for this one's).
func where(r watch.Report) string {
	root := "/"
	if r.HostPath != r.Path && strings.HasSuffix(r.HostPath, r.Path) {
		// A process of this root is reached through /proc/PID/root too.
		if other := strings.TrimSuffix(r.HostPath, r.Path); !sameFile(other, "/") {
			root = other
		}
	}
	return fmt.Sprintf("dev %d:%d inode %d, root %s", r.File.Major, r.File.Minor, r.File.Inode, root)
}

// sameFile reports whether a and b are one file (or directory).
func sameFile(a, b string) bool {
	fa, err := os.Stat(a)
	if err != nil {
		return false
	}
	fb, err := os.Stat(b)
	return err == nil && os.SameFile(fa, fb)
}

// table returns the sites seen, by cookie, in cookie order.
func (fl *follower) table() []multiprobe.Site {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	out := make([]multiprobe.Site, 0, len(fl.sites))
	for _, s := range fl.sites {
		if s.Cookie < followSlots {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b multiprobe.Site) int { return cmp.Compare(a.Cookie, b.Cookie) })
	return out
}

// checkTargets resolves each probe in this root, as count does for one
// process, so that a bad pattern, a path that names no file or a target
// that is no binary fails at once. A bare name or a path glob that names
// no file here is no error: a container may map one later, and stderr
// says that count waits for it.
func checkTargets(probes []multiprobe.Probe, opts *multiprobe.Options, stderr io.Writer) error {
	for _, p := range probes {
		plan, err := multiprobe.Resolve([]multiprobe.Probe{p}, opts)
		if err == nil {
			plan.Close()
			continue
		}
		if !errors.Is(err, elfsym.ErrNotFound) {
			return err
		}
		if strings.Contains(p.Target, "/") && !strings.ContainsAny(p.Target, "*?[") {
			return fmt.Errorf("%w (a path names a file of this machine's; for a file of that name in any container, give the name alone: %s)",
				err, multiprobe.Probe{Kind: p.Kind, Target: filepath.Base(p.Target), Patterns: p.Patterns})
		}
		fmt.Fprintf(stderr, "%s: no such file here yet; waiting for a process to map one\n", p)
	}
	return nil
}

// followed is what a follow run saw, for its report.
type followed struct {
	end   countEnd
	sites []multiprobe.Site // of every file attached, by cookie
	files []fileEntry
	// skipped is how many files matched and could not be attached.
	skipped int
	// leftOut are the sites of the files attached that are not.
	leftOut []multiprobe.Site
}

// newFollower makes the view of a follow run; attached, if not nil, is
// told of each file's sites before they are attached.
func newFollower(stderr io.Writer, verbose bool, attached func(watch.Report)) *follower {
	fl := &follower{sites: map[uint64]multiprobe.Site{}, stderr: stderr, attached: attached, skipped: map[string]bool{},
		fileAt: map[watch.FileID]*fileEntry{}, leftOutSeen: map[leftOutKey]bool{}}
	if verbose {
		fl.verbose = stderr
	}
	return fl
}

// slots is how many of the counter's slots hold the sites of the files
// attached so far: one past the highest cookie counted.
func (fl *follower) slots() int {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	n := 0
	for c := range fl.sites {
		if c < followSlots {
			n = max(n, int(c)+1)
		}
	}
	return n
}

// lookup finds the site of a cookie among the files attached so far: how
// --args names a hit in a follow run.
func (fl *follower) lookup(cookie uint32) (multiprobe.Site, bool) {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	s, ok := fl.sites[uint64(cookie)]
	return s, ok
}

// follow counts through a watch until duration passes or SIGINT or
// SIGTERM arrives, and returns the sites of every file attached
// meanwhile, with the run-time statistics of the programs that ran at
// them (prog, or the copies a file's link made). A signal ends a follow
// run as a duration does: it is how one is ended, so the run's status is
// 0 (bpftrace's and funccount's after Ctrl-C), and done's says whether
// anything was attached.
func (fl *follower) follow(probes []multiprobe.Probe, spec *ebpf.CollectionSpec, prog *ebpf.Program, opts multiprobe.Options, duration time.Duration) (out followed, err error) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	// Each file is attached on its own, a progress line each would be
	// noise.
	opts.Progress = nil
	w, err := watch.New(probes, spec, prog, &watch.Options{Plan: opts, Report: fl.report, Resolved: fl.attached})
	if err != nil {
		return out, err
	}
	start := time.Now()
	var deadline <-chan time.Time
	if duration > 0 {
		deadline = time.After(duration)
	} else {
		fmt.Fprintf(fl.stderr, "following every process; Ctrl-C to stop\n")
	}
	select {
	case <-deadline:
	case sig := <-sigs:
		fmt.Fprintf(fl.stderr, "%v: detaching\n", sig)
	}
	out.end.elapsed = time.Since(start)
	progs := []*ebpf.Program{prog}
	live := w.Files()
	fl.mu.Lock()
	for _, f := range live {
		if fe := fl.fileAt[f.ID]; fe != nil {
			fe.Processes = f.Processes
		}
	}
	fl.mu.Unlock()
	for _, f := range live {
		for _, p := range f.Link.Programs() {
			if !slices.Contains(progs, p) {
				progs = append(progs, p)
			}
		}
	}
	for _, p := range progs {
		if st, err := p.Stats(); err == nil {
			out.end.stats.RunCount += st.RunCount
			out.end.stats.Runtime += st.Runtime
		}
	}
	if err := w.Close(); err != nil {
		return out, err
	}
	fl.mu.Lock()
	out.files = make([]fileEntry, len(fl.files))
	for i, fe := range fl.files {
		out.files[i] = *fe
	}
	out.skipped = len(fl.skipped)
	out.leftOut = fl.leftOut
	fl.mu.Unlock()
	out.sites = fl.table()
	return out, nil
}

// done is the status of a follow run whose report is written: an error
// (after a line on stderr that says why) if nothing was attached, as the
// zero it counted would otherwise look like a count.
func (fw *followed) done(probes []multiprobe.Probe, stderr io.Writer) error {
	if len(fw.files) > 0 {
		return nil
	}
	var targets []string
	for _, p := range probes {
		if !slices.Contains(targets, p.Target) {
			targets = append(targets, p.Target)
		}
	}
	if fw.skipped > 0 {
		fmt.Fprintf(stderr, "nothing attached: %d %s matched and could not be attached (see above)\n", fw.skipped, plural(fw.skipped, "file", "files"))
	} else {
		fmt.Fprintf(stderr, "nothing attached: no process mapped %s in %v\n", strings.Join(targets, " or "), fw.end.elapsed.Round(time.Millisecond))
	}
	return &exitStatus{code: 1}
}

// mergeRows adds up the rows of one kind and function: copies of a
// function in several builds of a library (each build has cookies of its
// own) are one row, as they are one function to the reader.
func mergeRows(rows []countedSite, by byFlag) []countedSite {
	type key struct {
		kind, fn, path string
		pid            int
		cgroup         string
	}
	at := map[key]int{}
	out := rows[:0]
	for _, r := range rows {
		k := key{kind: r.Kind, fn: r.Function, pid: r.PID, cgroup: r.Cgroup}
		if by == byFile {
			k.path = r.Path
		}
		if i, ok := at[k]; ok {
			out[i].Calls += r.Calls
			out[i].Sites += r.Sites
			if out[i].Path != r.Path {
				out[i].Path = ""
			}
			continue
		}
		at[k] = len(out)
		out = append(out, r)
	}
	sortRows(out)
	return out
}

// runCountFollow is count with no command and no --pid: every process's
// files that the probes' targets match, now and as they appear.
func runCountFollow(f *countFlags, probes []multiprobe.Probe, tr *tracer, stdout, stderr io.Writer) error {
	if err := checkTargets(probes, tr.opts, stderr); err != nil {
		return err
	}
	spec, c, err := followCounter(f.withArgs, f.nargs, f.strs, f.trace.by, tr.opts)
	if err != nil {
		return err
	}
	defer c.close()
	var fill func(watch.Report) // --args: each file's sites named before they hit
	if c.tracer != nil {
		fill = c.tracer.Fill
	}
	fl := newFollower(stderr, f.trace.verbose, fill)
	// A hit is named by the sites of the files attached before it: a
	// file's sites are in before its link is made.
	var hitLog []hitRecord
	stop, err := c.startExtras(f, stdout, &hitLog)
	if err != nil {
		return err
	}
	defer stop()
	var prof *runningProfile
	if f.profiling {
		// The program itself, where the links run it; a kernel without
		// BPF cookies runs a copy a site, which the profile does not see.
		if prof, err = startProfile(c.prog, nil, f.profile.freq); err != nil {
			return fmt.Errorf("--profile: %w", err)
		}
		defer prof.close()
	}
	meter := startHitMeter(c.counts, fl.slots, func(i uint32) string { s, _ := fl.lookup(i); return s.Label() }, f.maxRate, stderr)
	fw, err := fl.follow(probes, spec, c.prog, *tr.opts, time.Duration(f.trace.duration))
	meter.stop()
	if c.stopHits != nil {
		c.stopHits()
	}
	if err != nil {
		return err
	}
	if prof != nil {
		if fw.end.profile, err = prof.stop(); err != nil {
			return fmt.Errorf("--profile: %w", err)
		}
	}
	report, err := c.report(probes, fw.sites, 0, f.trace.by)
	if err != nil {
		return err
	}
	report.Counts = mergeRows(report.Counts, f.trace.by)
	if top := f.trace.top; top > 0 && len(report.Counts) > top {
		report.Omitted = len(report.Counts) - top
		report.Counts = report.Counts[:top]
	}
	report.Kernel, report.Path, report.Duration = tr.features.Release, tr.features.Path().String(), fw.end.elapsed
	report.Files = fw.files
	report.LeftOut = leftOut(fw.leftOut)
	if err := report.finish(f, fw.end, hitLog, c); err != nil {
		return err
	}
	if err := report.write(stdout, f, fw.end); err != nil {
		return err
	}
	return fw.done(probes, stderr)
}

// namesThem is the hint after a follow run's count of files, where -v did
// not name them already.
func namesThem(verbose bool) string {
	if verbose {
		return ""
	}
	return " (--verbose names them)"
}
