package watch

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/multiprobe/multiprobe/elfsym"
	"github.com/multiprobe/multiprobe/internal/fds"
)

// spellings returns the ways a process's maps may name what target means
// in this root: target itself, and for a path, the file its symbolic links
// lead to (/bin/bash is /usr/bin/bash where /bin links to usr/bin, and the
// maps give the file's own path).
func spellings(target string) []string {
	out := []string{target}
	if strings.Contains(target, "/") && !strings.ContainsAny(target, "*?[") {
		if real, err := filepath.EvalSymlinks(target); err == nil && real != target {
			out = append(out, real)
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
