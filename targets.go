package multiprobe

import (
	"errors"
	"fmt"

	"github.com/multiprobe/multiprobe/elfsym"
	"github.com/multiprobe/multiprobe/internal/glob"
	"github.com/multiprobe/multiprobe/usdt"
)

// resolveTargets resolves p in each file its target names: the one file
// of a path or a library name; with a glob in the path
// (/usr/lib/*/libssl.so*), every regular file it matches, in the
// process's root with Options.PID; and "*" with Options.PID, every file
// the process maps executable, as bpftrace's uprobe:*:FUNC -p PID. Each
// file attaches through its own link. Of a glob's files, those where
// nothing matches (or that are not ELF files) are left out; none matching
// is an error.
func (r *resolver) resolveTargets(p *Probe) ([]planned, error) {
	if glob.IsLiteral(p.Target) {
		pp, err := r.resolve(p, p.Target)
		if err != nil {
			return nil, err
		}
		return []planned{pp}, nil
	}
	files, err := r.pl.expand(p.Target)
	if err != nil {
		return nil, err
	}
	var out []planned
	var errs []error
	for _, f := range files {
		pp, err := r.resolve(p, f)
		switch {
		case err == nil:
			out = append(out, pp)
		case errors.Is(err, elfsym.ErrNoMatch), errors.Is(err, usdt.ErrNoProbes), errors.Is(err, elfsym.ErrNotELF):
		default:
			errs = append(errs, err)
		}
	}
	if len(out) == 0 {
		if len(errs) > 0 {
			return nil, errors.Join(errs...)
		}
		return nil, fmt.Errorf("%w in any of the %d files %q names", errNoMatchIn(p), len(files), p.Target)
	}
	return out, nil
}

// errNoMatchIn is the no-match error of p's kind.
func errNoMatchIn(p *Probe) error {
	if p.Kind == USDT {
		return usdt.ErrNoProbes
	}
	return elfsym.ErrNoMatch
}

// expand returns the files a target with a glob names: see
// resolveTargets.
func (pl *Plan) expand(target string) ([]string, error) {
	pid := pl.opts.PID
	if target == "*" {
		if pid == 0 {
			return nil, fmt.Errorf("%w: target * means every file a process maps: give its pid (Options.PID, -p)", ErrBadSpec)
		}
		maps, err := elfsym.ExecutableMappings(pid)
		if err != nil {
			return nil, err
		}
		sameRoot := elfsym.ProcessRoot(pid) == ""
		var files []string
		for _, m := range maps {
			if sameRoot && !m.Deleted {
				files = append(files, m.Path)
			} else {
				files = append(files, m.HostPath)
			}
		}
		return files, nil
	}
	files, err := elfsym.GlobIn(pl.lookupRoot(target), target)
	if errors.Is(err, elfsym.ErrBadPattern) {
		return nil, fmt.Errorf("%w: %w", ErrBadSpec, err)
	}
	return files, err
}
