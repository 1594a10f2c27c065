package watch

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Budgets.
//
// Every file a watch attaches costs it file descriptors (the file, its
// plan's, the link's: three on uprobe_multi, one a site before Linux
// 6.6), kernel links and memory, and any user of the node can make files
// for it: 1,500 copies of a matching library, mapped by nobody, took
// every descriptor of an agent at RLIMIT_NOFILE 2048, after which no file
// of anyone was attached. So a watch holds at most Options.MaxFiles files
// and Options.MaxFDs descriptors, and of those a user other than root, or
// a mount namespace other than the watch's own (a container), at most an
// eighth each, and all of them together three quarters: what root runs
// in the watch's own root is never crowded out, and no one user or
// container takes what the others need. A file past a budget is Skipped
// with an error wrapping ErrBudget, once, and tried again as a failed
// file is (see failed.go), so it gets in when others leave.

// ErrBudget is wrapped by the error of a file skipped because its owner
// (the user or mount namespace of the process that mapped it) or the
// watch holds all the files or file descriptors it may (Options.MaxFiles,
// Options.MaxFDs).
var ErrBudget = errors.New("over the watch's budget")

const (
	defaultMaxFiles = 10_000
	// shareDiv is the share of one user or mount namespace: 1/shareDiv.
	shareDiv = 8
)

// owner is whose a file is: the user and mount namespace of the process
// that mapped it first.
type owner struct {
	uid  uint32
	ns   uint64 // the mount namespace's inode number
	host bool   // ns is the watch's own
}

// trusted reports whether o's files run first and need no share: root's
// in the watch's own root.
func (o owner) trusted() bool { return o.uid == 0 && o.host }

// ownNS is this process's mount namespace, 0 if unknown.
var ownNS = nsOf("/proc/self/ns/mnt")

func nsOf(path string) uint64 {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil {
		return 0
	}
	return st.Ino
}

// ownerOf returns pid's owner: its real user (who ran it: a set-user-ID
// program run by nobody is nobody's) and its mount namespace. Not the
// owner of /proc/PID, which is root for a process that changed its user.
// A process gone already is nobody's own: untrusted, and its attach
// fails anyway.
func ownerOf(pid int) owner {
	proc := "/proc/" + strconv.Itoa(pid)
	unknown := owner{uid: ^uint32(0)}
	status, err := os.ReadFile(proc + "/status")
	if err != nil {
		return unknown
	}
	_, rest, ok := strings.Cut(string(status), "\nUid:")
	if !ok {
		return unknown
	}
	f := strings.Fields(rest)
	if len(f) == 0 {
		return unknown
	}
	uid, err := strconv.ParseUint(f[0], 10, 32)
	if err != nil {
		return unknown
	}
	ns := nsOf(proc + "/ns/mnt")
	return owner{uid: uint32(uid), ns: ns, host: ns != 0 && ns == ownNS}
}

// usage is what some owners hold: files (attached or pending), of them
// pending, and the fds of those attached.
type usage struct{ files, pending, fds int }

// budget counts what the watch's files hold, by owner. It is guarded by
// the watch's lock.
type budget struct {
	maxFiles, maxFDs int
	all, guests      usage // guests: every owner but the trusted
	byUID            map[uint32]*usage
	byNS             map[uint64]*usage
}

func newBudget(maxFiles, maxFDs int) *budget {
	if maxFiles <= 0 {
		maxFiles = defaultMaxFiles
	}
	if maxFDs <= 0 {
		maxFDs = defaultMaxFDs()
	}
	return &budget{maxFiles: maxFiles, maxFDs: maxFDs, byUID: map[uint32]*usage{}, byNS: map[uint64]*usage{}}
}

// defaultMaxFDs is half this process's limit of open files: the other
// half is the rest of the program's (an agent's connections, its maps).
func defaultMaxFDs() int {
	var lim unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &lim) != nil || lim.Cur == unix.RLIM_INFINITY || lim.Cur > 1<<30 {
		return 1 << 20
	}
	return max(int(lim.Cur/2), 64)
}

// limits returns the usages o's files count against, each with its limits
// and a name for errors.
func (b *budget) limits(o owner) []limit {
	ls := []limit{{&b.all, b.maxFiles, b.maxFDs, "the watch's"}}
	if o.trusted() {
		return ls
	}
	ls = append(ls, limit{&b.guests, b.maxFiles * 3 / 4, b.maxFDs * 3 / 4, "other users' and containers'"})
	if o.uid != 0 {
		ls = append(ls, limit{usageOf(b.byUID, o.uid), b.maxFiles / shareDiv, b.maxFDs / shareDiv, fmt.Sprintf("uid %d's", o.uid)})
	}
	if !o.host {
		ls = append(ls, limit{usageOf(b.byNS, o.ns), b.maxFiles / shareDiv, b.maxFDs / shareDiv, fmt.Sprintf("mount namespace %d's", o.ns)})
	}
	return ls
}

type limit struct {
	u                *usage
	maxFiles, maxFDs int
	name             string
}

func usageOf[K comparable](m map[K]*usage, k K) *usage {
	u := m[k]
	if u == nil {
		u = &usage{}
		m[k] = u
	}
	return u
}

// admit says whether o may queue one more file: one more fits, and so
// do the fds a file holds (as many as the files attached hold on
// average, at least three), for every file of o's pending too. What does
// not fit is known before it is attached, to be closed again at once.
func (b *budget) admit(o owner, path string, pid int) error {
	defer b.tidy(o)
	each := 3
	if attached := b.all.files - b.all.pending; attached > 0 {
		each = max(each, (b.all.fds+attached-1)/attached)
	}
	for _, l := range b.limits(o) {
		if l.u.files+1 > l.maxFiles {
			return fmt.Errorf("%s (mapped by process %d): %w: %s share is %d files, all held", path, pid, ErrBudget, l.name, l.maxFiles)
		}
		if l.u.fds+(l.u.pending+1)*each > l.maxFDs {
			return fmt.Errorf("%s (mapped by process %d): %w: %s share is %d file descriptors, %d held, %d files being attached", path, pid, ErrBudget, l.name, l.maxFDs, l.u.fds, l.u.pending)
		}
	}
	return nil
}

// fit says whether o's file, admitted, may keep the fds it holds now that
// it is attached.
func (b *budget) fit(o owner, fds int, path string, pid int) error {
	for _, l := range b.limits(o) {
		if l.u.fds+fds > l.maxFDs {
			return fmt.Errorf("%s (mapped by process %d): %w: attached, it holds %d file descriptors, past %s share of %d (%d held)", path, pid, ErrBudget, fds, l.name, l.maxFDs, l.u.fds)
		}
	}
	return nil
}

// queued, attached, dropped and detached count o's file in and out: it
// is queued (pending), then attached with fds, or dropped; an attached
// file is detached at last.
func (b *budget) queued(o owner)            { b.add(o, usage{files: 1, pending: 1}) }
func (b *budget) attached(o owner, fds int) { b.add(o, usage{pending: -1, fds: fds}) }
func (b *budget) dropped(o owner)           { b.add(o, usage{files: -1, pending: -1}) }
func (b *budget) detached(o owner, fds int) { b.add(o, usage{files: -1, fds: -fds}) }

func (b *budget) add(o owner, d usage) {
	for _, l := range b.limits(o) {
		l.u.files += d.files
		l.u.pending += d.pending
		l.u.fds += d.fds
	}
	b.tidy(o)
}

// tidy forgets o's entries if they hold nothing.
func (b *budget) tidy(o owner) {
	// An owner holding nothing is forgotten: a user who maps files from
	// a thousand mount namespaces leaves no thousand entries behind.
	if u := b.byUID[o.uid]; u != nil && *u == (usage{}) {
		delete(b.byUID, o.uid)
	}
	if u := b.byNS[o.ns]; u != nil && *u == (usage{}) {
		delete(b.byNS, o.ns)
	}
}

// held is how many files o's user or mount namespace holds, the more of
// the two, for the queue's order.
func (b *budget) held(o owner) int {
	n := 0
	if u := b.byUID[o.uid]; u != nil && o.uid != 0 {
		n = u.files
	}
	if u := b.byNS[o.ns]; u != nil && !o.host {
		n = max(n, u.files)
	}
	return n
}
