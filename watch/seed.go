package watch

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/multiprobe/multiprobe/elfsym"
	"github.com/multiprobe/multiprobe/internal/fds"
)

// spellings returns the ways a process's maps may name what target means
// in this root. The maps name a file by its absolute path with its
// symbolic links resolved, so a relative path is taken against the working
// directory, as bpftrace and the mode with a command take it, and a path
// also means the file its symbolic links lead to (/bin/bash is
// /usr/bin/bash where /bin links to usr/bin); for a path glob, the links
// of its directory. A bare name is matched by file name (matchTarget).
func spellings(target string) []string {
	out := []string{target}
	if !strings.Contains(target, "/") {
		return out
	}
	add := func(p string) {
		if p != "" && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	abs, err := filepath.Abs(target)
	if err != nil {
		return out
	}
	add(abs)
	if !strings.ContainsAny(target, "*?[") {
		if real, err := filepath.EvalSymlinks(abs); err == nil {
			add(real)
		}
		return out
	}
	dir, pattern := filepath.Split(abs)
	if !strings.ContainsAny(dir, "*?[") {
		if real, err := filepath.EvalSymlinks(dir); err == nil {
			add(filepath.Join(real, pattern))
		}
	}
	return out
}

// seedFiles returns the files the targets name in this root: a path, the
// files a path glob matches, the library or program a bare name is.
func seedFiles(targets []string) []string {
	var out []string
	for _, t := range targets {
		var files []string
		switch {
		case strings.ContainsAny(t, "*?[") && strings.Contains(t, "/"):
			files, _ = elfsym.GlobIn("", t)
		default:
			if p, err := elfsym.LookPath(t); err == nil {
				files = []string{p}
			}
		}
		out = append(out, files...)
	}
	return out
}

// A seed is a file the watch maps into its own process, executable and
// never run, so that the tracker sees it mapped (by this process) and
// attaches it before any program runs it: a program started later is
// probed from its first instruction, where a mapping seen from the events
// is attached a millisecond or so after it appears.
type seed struct {
	path string
	mem  []byte
}

// mapSeed maps the file at path whole, read-only and executable.
func mapSeed(path string) (*seed, error) {
	f, err := fds.OpenRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.Size() == 0 {
		return nil, fmt.Errorf("%s: an empty file", path)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ|unix.PROT_EXEC, unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("mapping %s: %w", path, err)
	}
	return &seed{path: path, mem: mem}, nil
}

func (s *seed) close() error {
	if s.mem == nil {
		return nil
	}
	err := unix.Munmap(s.mem)
	s.mem = nil
	if err != nil {
		return fmt.Errorf("unmapping %s: %w", s.path, err)
	}
	return nil
}

// closeSeeds unmaps every seed.
func closeSeeds(seeds []*seed) error {
	var errs []error
	for _, s := range seeds {
		errs = append(errs, s.close())
	}
	return errors.Join(errs...)
}
