// Package fds counts this process's open file descriptors, which the
// per-site attach path spends two of per site and which tests check are
// all given back, and opens the files that multiprobe reads so that a FIFO
// or a device cannot hang or feed it.
package fds

import (
	"errors"
	"strings"
)

// ErrNotRegular is returned by OpenRegular for a path that is not a
// regular file (a FIFO, a device, a directory).
var ErrNotRegular = errors.New("not a regular file")

// ErrBudget: an attach needs more file descriptors than RLIMIT_NOFILE's
// hard limit allows. Package fallback exports it as ErrFDBudget.
var ErrBudget = errors.New("not enough file descriptors for per-site uprobes")

// slack covers the descriptors cilium/ebpf opens for a moment while
// attaching (feature probes, the binary) and those other goroutines may open
// meanwhile.
const slack = 64

// SplitProcRoot splits a path of the form /proc/PID/root/REST into the
// root directory and REST, as written: before any cleaning, which would
// let a ".." in REST climb out of the root.
func SplitProcRoot(path string) (root, rest string, ok bool) {
	after, found := strings.CutPrefix(path, "/proc/")
	if !found {
		return "", "", false
	}
	pid, tail, found := strings.Cut(after, "/")
	if !found || pid == "" || strings.Trim(pid, "0123456789") != "" && pid != "self" {
		return "", "", false
	}
	tail, found = strings.CutPrefix(tail, "root")
	if !found || (tail != "" && tail[0] != '/') {
		return "", "", false
	}
	return "/proc/" + pid + "/root", strings.TrimLeft(tail, "/"), true
}
