package watch

import (
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/multiprobe/multiprobe/elfsym"
)

// fileKey is a file: its device and inode. Where the kernel lists a
// process's mappings to a BPF iterator (Linux 6.1), it is the inode the
// kernel maps, where a uprobe goes: behind an overlay, the layer's file.
// /proc/PID/maps shows there (from about Linux 6.8) the overlay mount's
// device with the real file's inode number (6.18: two mounts over one
// lower file show 00:27 10078100 and 00:29 10078100, the file itself
// fe:00 10078100): keyed so, containers of one image would be one file
// each, each attached, and a call counted once per container. Before 6.1
// the key is what the maps show, which there is the mapped (real) file.
type fileKey struct {
	major, minor uint32
	ino          uint64
}

func (k fileKey) id() FileID { return FileID{Major: k.major, Minor: k.minor, Inode: k.ino} }

// tracked is a file that matches the watch's targets, and the processes
// that map it.
type tracked struct {
	key fileKey
	// path is the file as the first process that mapped it names it, and
	// hostPath reaches it from here (through that process's root).
	path, hostPath string
	// hostDev and hostIno are what stat gave for hostPath when it was
	// found to be the file mapped (0: not known).
	hostDev, hostIno uint64
	users            map[int]bool
	// mapped counts the processes that mapped it since it was tracked.
	mapped int
}

// tracker follows which processes map which matching files, from an
// initial scan of /proc and then from events. It calls appeared when a
// matching file is mapped for the first time, and idle when its last
// user is gone. It is not safe for concurrent use.
type tracker struct {
	match func(path string) bool
	// real, if not nil, lists a process's executable mappings by start
	// with the files the kernel maps (source.fileVMAs).
	real     func(pid int) (map[uint64]fileKey, error)
	appeared func(f *tracked, pid int)
	// reached, if not nil, is told when a file tracked with no path yet
	// (see Watch.restore) is first mapped by a process.
	reached func(f *tracked, pid int)
	// again, if not nil, is told when a file tracked already gets another
	// user (see Watch.again).
	again func(f *tracked, pid int)
	idle  func(f *tracked)
	files map[fileKey]*tracked
	byPID map[int][]fileKey
}

func newTracker(match func(string) bool, appeared func(*tracked, int), idle func(*tracked)) *tracker {
	return &tracker{match: match, appeared: appeared, idle: idle, files: map[fileKey]*tracked{}, byPID: map[int][]fileKey{}}
}

// scan reads every process's mappings: what runs when the watch starts.
func (t *tracker) scan() {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			t.mapped(pid)
		}
	}
}

// rescan is scan after events were lost: every process's mappings are
// read again, then processes tracked that are gone have exited (in that
// order, so that a file another process maps now does not go idle on the
// way).
func (t *tracker) rescan() {
	t.scan()
	for pid := range t.byPID {
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err != nil {
			t.exited(pid)
		}
	}
}

// handle updates the files' users for an event.
func (t *tracker) handle(e event) {
	pid := int(e.PID)
	switch e.Kind {
	case eventExec:
		t.exited(pid) // the old program's mappings are gone
		t.mapped(pid)
	case eventMmap:
		t.mappedAt(pid, map[uint64]bool{e.Addr: true})
	case eventExit:
		t.exited(pid)
	}
}

// mapped adds pid as a user of the matching files it maps.
func (t *tracker) mapped(pid int) {
	t.mappedIf(pid, func(m elfsym.Mapping) bool { return m.Inode != 0 && t.match(m.Path) })
}

// handleAll is handle for events read together (see Watch.loop): a
// process's mmap events in a row are one read of its mappings, not one
// each, so that a process mapping thousands of files costs the watch a
// read of its list per batch of events, not per file. Events of one
// process keep their order; those of different processes need none.
func (t *tracker) handleAll(events []event) {
	var order []int
	at := map[int]map[uint64]bool{}
	flush := func(pid int) {
		if addrs := at[pid]; addrs != nil {
			delete(at, pid)
			t.mappedAt(pid, addrs)
		}
	}
	for _, e := range events {
		pid := int(e.PID)
		if e.Kind != eventMmap {
			flush(pid)
			t.handle(e)
			continue
		}
		if at[pid] == nil {
			at[pid] = map[uint64]bool{}
			order = append(order, pid)
		}
		at[pid][e.Addr] = true
	}
	for _, pid := range order {
		flush(pid)
	}
}

// mappedAt is mapped for the mappings that start at addrs, which mmap
// events name: a file the process maps already is not new, so the
// others are not looked at again (with 1,000 mappings, each stat'ed at
// every event, a legitimate file waited 9 s). A second mapping of a file
// the process maps lower down is no Mapping's start, and no new user.
func (t *tracker) mappedAt(pid int, addrs map[uint64]bool) {
	t.mappedIf(pid, func(m elfsym.Mapping) bool { return addrs[m.Start] && m.Inode != 0 && t.match(m.Path) })
}

func (t *tracker) mappedIf(pid int, keep func(elfsym.Mapping) bool) {
	maps, err := elfsym.ExecutableMappingsIf(pid, keep)
	if err != nil {
		return // exited meanwhile, or a kernel thread
	}
	if len(maps) == 0 {
		return
	}
	var real map[uint64]fileKey
	if t.real != nil {
		if real, err = t.real(pid); err != nil {
			return // exited meanwhile
		}
	}
	for _, m := range maps {
		k := fileKey{m.Major, m.Minor, m.Inode}
		if real != nil {
			var ok bool
			if k, ok = real[m.Start]; !ok {
				continue // unmapped since the maps were read
			}
		}
		f := t.files[k]
		if f == nil {
			f = &tracked{key: k, path: m.Path, hostPath: m.HostPath, hostDev: m.HostDev, hostIno: m.HostIno, users: map[int]bool{}, mapped: 1}
			t.files[k] = f
			f.users[pid] = true
			t.byPID[pid] = append(t.byPID[pid], k)
			t.appeared(f, pid)
			continue
		}
		if !f.users[pid] {
			f.users[pid] = true
			f.mapped++
			t.byPID[pid] = append(t.byPID[pid], k)
			if t.again != nil {
				t.again(f, pid)
			}
		}
		if f.hostPath == "" && t.reached != nil {
			// Tracked before any process mapped it (a pin taken back).
			f.path, f.hostPath, f.hostDev, f.hostIno = m.Path, m.HostPath, m.HostDev, m.HostIno
			t.reached(f, pid)
		}
	}
}

// remapped reads pid's mappings again after it unmapped some, which no
// event reports: it stays a user of the files it still maps.
func (t *tracker) remapped(pid int) {
	t.exited(pid)
	t.mapped(pid)
}

// exited removes pid from the users of its files.
func (t *tracker) exited(pid int) {
	for _, k := range t.byPID[pid] {
		f := t.files[k]
		if f == nil {
			continue
		}
		delete(f.users, pid)
		if len(f.users) == 0 {
			t.idle(f)
		}
	}
	delete(t.byPID, pid)
}

// forget stops tracking f (its link is closed): if it is mapped again, it
// appears again.
func (t *tracker) forget(f *tracked) {
	delete(t.files, f.key)
}

// matchTarget reports whether a file at p (as a process names it) is what
// a probe target means: the path itself, a path glob, or a bare name: a
// program or library of that name, a library name without its ".so"
// ("libc", "libssl") with any soname version, as elfsym.LookPath finds
// them.
func matchTarget(target, p string) bool {
	p = strings.TrimSuffix(p, " (deleted)")
	if strings.Contains(target, "/") {
		if ok, err := path.Match(filepath.Clean(target), p); err == nil && ok {
			return true
		}
		return filepath.Clean(target) == p
	}
	base := path.Base(p)
	if base == target {
		return true
	}
	if strings.Contains(target, ".so") {
		return strings.HasPrefix(base, target+".") // libssl.so matches libssl.so.3
	}
	return strings.HasPrefix(base, target+".so")
}
