package main

import (
	"cmp"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/count"
	"github.com/multiprobe/multiprobe/latency"
)

// byFlag is --by: what count's rows are per besides the function.
type byFlag string

const (
	byNone      byFlag = ""
	byPID       byFlag = "pid"
	byFile      byFlag = "file"
	byContainer byFlag = "container"
)

func (b *byFlag) String() string { return string(*b) }

func (b *byFlag) Set(v string) error {
	switch byFlag(v) {
	case byPID, byFile, byContainer:
		*b = byFlag(v)
		return nil
	}
	return fmt.Errorf("%q: want pid, file or container", v)
}

// How many (site or function, who) pairs count and latency count by.
const (
	maxByCounts = count.DefaultMaxBy
	maxByHists  = latency.DefaultMaxBy
)

// A caller is who made a row's calls, with --by pid or container: the
// process (its command name, "" once it exited), or its cgroup (the path
// under the cgroup v2 root) and the container id that path holds, if any.
type caller struct {
	PID       int    `json:"pid,omitempty"`
	Comm      string `json:"comm,omitempty"`
	Cgroup    string `json:"cgroup,omitempty"`
	Container string `json:"container,omitempty"`
}

// caller names who, as by reads it.
func (cg cgroupPaths) caller(by byFlag, who uint64) caller {
	switch by {
	case byPID:
		return caller{PID: int(who), Comm: comm(int(who))}
	case byContainer:
		p := cg.path(who)
		return caller{Cgroup: p, Container: containerID(p)}
	}
	return caller{}
}

// rowsBy turns the counts by who made them (--by pid or container) into
// rows, one a function and who: a USDT probe's sites, and in a follow
// run a function's copies in several builds, add up. unattributed is how
// many calls the table had no room to attribute.
func rowsBy(by byFlag, snap *count.Snapshot, probeIndex func(*multiprobe.Probe) int) (rows []countedSite, unattributed uint64) {
	type key struct {
		kind, fn string
		who      uint64
	}
	at := map[key]int{}
	cg := cgroupPaths{}
	for _, b := range snap.By {
		s := snap.Sites[b.Site].Site
		kk := key{s.Probe.Kind.String(), s.Label(), b.Who}
		if i, ok := at[kk]; ok {
			rows[i].Calls += b.Calls
			rows[i].Sites++
			continue
		}
		at[kk] = len(rows)
		rows = append(rows, countedSite{Probe: probeIndex(s.Probe), Kind: kk.kind, Function: kk.fn, Path: s.Path, Offset: s.Offset, Calls: b.Calls, Sites: 1,
			caller: cg.caller(by, b.Who)})
	}
	sortRows(rows)
	return rows, snap.Unattributed
}

// sortRows orders rows most calls first, then by function, kind and who.
func sortRows(rows []countedSite) {
	slices.SortStableFunc(rows, func(a, b countedSite) int {
		return cmp.Or(cmp.Compare(b.Calls, a.Calls), cmp.Compare(a.Function, b.Function), cmp.Compare(a.Kind, b.Kind),
			cmp.Compare(a.PID, b.PID), cmp.Compare(a.Cgroup, b.Cgroup), cmp.Compare(a.Path, b.Path))
	})
}

// comm is the command name of process pid, "" once it has exited.
func comm(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// cgroupRoot is where the cgroup v2 hierarchy is mounted: /sys/fs/cgroup,
// or on a hybrid system /sys/fs/cgroup/unified.
func cgroupRoot() string {
	b, err := os.ReadFile("/proc/self/mounts")
	if err == nil {
		for line := range strings.Lines(string(b)) {
			if f := strings.Fields(line); len(f) > 2 && f[2] == "cgroup2" {
				return f[1]
			}
		}
	}
	return "/sys/fs/cgroup"
}

// cgroupPaths finds a cgroup v2 id's path: the id is the inode number of
// the cgroup's directory. The hierarchy is read once, at the first id.
type cgroupPaths map[uint64]string

func (cg cgroupPaths) path(id uint64) string {
	if len(cg) == 0 {
		cg[0] = "" // read once
		root := cgroupRoot()
		filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			if fi, err := d.Info(); err == nil {
				if st, ok := fi.Sys().(*syscall.Stat_t); ok {
					rel := strings.TrimPrefix(p, root)
					if rel == "" {
						rel = "/"
					}
					cg[uint64(st.Ino)] = rel
				}
			}
			return nil
		})
	}
	if p, ok := cg[id]; ok && id != 0 {
		return p
	}
	return fmt.Sprintf("cgroup %d (gone)", id)
}

// containerIDRE finds a container id in a cgroup path, as kubelet,
// containerd, CRI-O, Docker and podman name them: 64 hex digits, alone
// or in cri-containerd-ID.scope, crio-ID.scope, docker-ID.scope,
// libpod-ID.scope.
var containerIDRE = regexp.MustCompile(`(?:^|[/-])([0-9a-f]{64})(?:\.scope)?(?:/|$)`)

// containerID is the container id in a cgroup path, "" if it holds none.
func containerID(cgroup string) string {
	m := containerIDRE.FindAllStringSubmatch(cgroup, -1)
	if len(m) == 0 {
		return ""
	}
	return m[len(m)-1][1]
}

// who is how the text report names a row's process, container or file
// (path).
func (r caller) who(by byFlag, path string) string {
	switch by {
	case byPID:
		if r.Comm == "" {
			return fmt.Sprintf("%d (exited)", r.PID)
		}
		return fmt.Sprintf("%d (%s)", r.PID, r.Comm)
	case byContainer:
		if r.Container != "" {
			return r.Container[:12] + " " + r.Cgroup
		}
		return r.Cgroup
	case byFile:
		return path
	}
	return ""
}
