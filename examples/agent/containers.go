package main

import (
	"io/fs"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
)

// Containers, from cgroups.
//
// The BPF program counts calls by cgroup id (bpf_get_current_cgroup_id:
// the inode of the process's cgroup v2 directory) and function. A
// container runtime puts each container in a cgroup of its own, whose
// directory name holds the container's id, and Kubernetes puts a pod's
// containers under a directory that holds the pod's uid:
//
//	containerd  .../kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope
//	CRI-O       .../kubepods-pod<uid>.slice/crio-<id>.scope
//	podman      .../libpod-<id>.scope, libpod-payload-<id>, libpod-<id>/container
//	Docker      .../docker-<id>.scope
//	cgroupfs    .../kubepods/burstable/pod<uid>/<id>
//
// A cgroup whose path holds no container id is the node's own (a system
// service, a login session): container "". A cgroup gone (its container
// exited) is never seen again (cgroup ids are not reused), so its counts
// leave the map and its series the output.

// cgroupRoot is where the node's cgroup v2 hierarchy is mounted: at
// /sys/fs/cgroup, or at /sys/fs/cgroup/unified on a node that mounts both
// versions (the ids the program counts by are always v2's). In a pod,
// config's cgroup_root names the node's, mounted in (see
// deploy/daemonset.yaml): the pod's own cgroup namespace shows only its
// own cgroups.
var cgroupRoot = findCgroupRoot("/sys/fs/cgroup")

const cgroup2Magic = 0x63677270

// findCgroupRoot returns dir, or dir/unified, whichever is cgroup v2.
func findCgroupRoot(dir string) string {
	for _, dir := range []string{dir, filepath.Join(dir, "unified")} {
		var st syscall.Statfs_t
		if syscall.Statfs(dir, &st) == nil && st.Type == cgroup2Magic {
			return dir
		}
	}
	return dir
}

var (
	containerIDRe = regexp.MustCompile(`(?:^|[-_])([0-9a-f]{64})(?:\.scope)?$`)
	podUIDRe      = regexp.MustCompile(`pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})`)
)

// container is what a cgroup's path says of its container: its id and
// its pod's uid, each "" where the path has none.
type container struct{ id, pod string }

// containerOf parses a cgroup's path (relative to the hierarchy's root).
func containerOf(path string) container {
	var c container
	for _, elem := range strings.Split(path, "/") {
		if m := containerIDRe.FindStringSubmatch(elem); m != nil {
			c.id = m[1]
		}
		if m := podUIDRe.FindStringSubmatch(elem); m != nil {
			c.pod = strings.ReplaceAll(m[1], "_", "-")
		}
	}
	return c
}

// cgroups names cgroup ids.
type cgroups struct {
	mu   sync.Mutex
	byID map[uint64]container
}

// lookup returns the containers of ids, from the hierarchy read once now
// (a few thousand directories on a busy node: a millisecond or so, at
// each scrape); gone are the ids no cgroup has any more.
func (cg *cgroups) lookup(ids []uint64) (found map[uint64]container, gone []uint64) {
	cg.mu.Lock()
	defer cg.mu.Unlock()
	found = map[uint64]container{}
	if len(ids) == 0 {
		return found, nil
	}
	cg.walk()
	for _, id := range ids {
		c, ok := cg.byID[id]
		if !ok {
			gone = append(gone, id)
			continue
		}
		found[id] = c
	}
	return found, gone
}

// walk reads the hierarchy: every cgroup's id and container, anew, so
// that the ids of cgroups gone are forgotten.
func (cg *cgroups) walk() {
	cg.byID = map[uint64]container{}
	filepath.WalkDir(cgroupRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		var st syscall.Stat_t
		if syscall.Stat(path, &st) != nil {
			return nil
		}
		rel, _ := filepath.Rel(cgroupRoot, path)
		cg.byID[st.Ino] = containerOf(rel)
		return nil
	})
}
