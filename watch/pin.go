package watch

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/multiprobe/multiprobe"
)

// pinName is the directory, under Options.PinDir, of file k's link. bpffs
// takes no dots in names; underscores it does.
func pinName(k fileKey) string {
	return fmt.Sprintf("f_%d_%d_%d", k.major, k.minor, k.ino)
}

// parsePinName is pinName's inverse.
func parsePinName(name string) (fileKey, bool) {
	f := strings.Split(name, "_")
	if len(f) != 4 || f[0] != "f" {
		return fileKey{}, false
	}
	maj, err1 := strconv.ParseUint(f[1], 10, 32)
	mnr, err2 := strconv.ParseUint(f[2], 10, 32)
	ino, err3 := strconv.ParseUint(f[3], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return fileKey{}, false
	}
	return fileKey{uint32(maj), uint32(mnr), ino}, true
}

// restore takes back the links an earlier Watch pinned under
// Options.PinDir: each file is tracked with no process yet (the scan
// finds them) and reported Restored. A pin that cannot be taken back is
// reported Skipped and left as it is; one whose file was deleted since is
// detached, unless the scan finds a process still running it.
func (w *Watch) restore() (stale []*attached, err error) {
	ents, err := os.ReadDir(w.opts.PinDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil // none yet
	}
	if err != nil {
		return nil, fmt.Errorf("watch: reading the pins in %s: %w", w.opts.PinDir, err)
	}
	for _, e := range ents {
		k, ok := parsePinName(e.Name())
		if !ok || !e.IsDir() {
			continue
		}
		dir := filepath.Join(w.opts.PinDir, e.Name())
		l, err := multiprobe.LoadPinnedLink(dir)
		if err != nil {
			if errors.Is(err, multiprobe.ErrNotPinned) {
				// A Pin cut short, whose pins LoadPinnedLink
				// removed: the file is attached anew, here.
				os.Remove(dir)
			}
			w.report(Report{What: Skipped, Path: dir, Err: err})
			continue
		}
		sites := w.given(l.Sites(), "")
		path := dir
		if len(sites) > 0 {
			path = sites[0].Path
		}
		if !w.configured(sites, path) {
			// None of this Watch's probes targets its file or has its
			// sites: not one to bring up to date when a process maps
			// the file (see update.go), but one to remove.
			err := errors.Join(l.Unpin(), l.Close())
			w.report(Report{What: Detached, Path: path, Err: err})
			continue
		}
		f := &tracked{key: k, path: path, users: map[int]bool{}}
		w.tr.files[k] = f
		// Root's, and in this root: taken back whoever mapped it.
		a := &attached{f: f, link: l, owner: owner{host: true}}
		a.nfds = a.fds()
		w.budget.queued(a.owner)
		w.budget.attached(a.owner, a.nfds)
		w.files[k] = a
		w.buildMu.Lock()
		for _, s := range sites {
			w.nextCookie = max(w.nextCookie, s.Cookie+1)
		}
		w.buildMu.Unlock()
		if len(l.StaleFiles()) > 0 {
			stale = append(stale, a)
		}
		w.report(Report{What: Restored, Path: path, Sites: sites})
	}
	return stale, nil
}

// configured reports whether a probe of this Watch targets the file at
// path, which a link taken back from a pin was attached to (through the
// root of a process, /proc/PID/root/..., where it was another's), or one
// of its sites is of a probe of this Watch, by kind and patterns (its
// target spelled otherwise).
func (w *Watch) configured(sites []multiprobe.Site, path string) bool {
	if w.match(path) || w.match(inRoot(path)) {
		return true
	}
	keys := map[string]bool{}
	for i := range w.probes {
		keys[probeKey(&w.probes[i])] = true
	}
	return slices.ContainsFunc(sites, func(s multiprobe.Site) bool { return keys[probeKey(s.Probe)] })
}

// inRoot is path without a /proc/PID/root prefix: the path as the
// process named it, in its own root.
func inRoot(path string) string {
	rest, ok := strings.CutPrefix(path, "/proc/")
	if !ok {
		return path
	}
	pid, rest, ok := strings.Cut(rest, "/")
	if _, err := strconv.Atoi(pid); err != nil || !ok {
		return path
	}
	if rest, ok = strings.CutPrefix(rest, "root/"); !ok {
		return path
	}
	return "/" + rest
}

// pin pins a's link under Options.PinDir, if set.
func (w *Watch) pin(a *attached) error {
	if w.opts.PinDir == "" {
		return nil
	}
	return a.link.Pin(filepath.Join(w.opts.PinDir, pinName(a.f.key)))
}

// Unpin removes every file's pinned link (Options.PinDir), so that Close
// detaches them: for an agent that is being removed, not restarted. A
// file attached after Unpin is not pinned either. Without a PinDir it
// does nothing.
func (w *Watch) Unpin() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.unpinned = true
	if w.opts.PinDir == "" {
		return nil // nothing pinned
	}
	var errs []error
	for _, a := range w.files {
		errs = append(errs, a.link.Unpin())
	}
	return errors.Join(errs...)
}
