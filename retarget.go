package multiprobe

import (
	"bytes"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/multiprobe/multiprobe/elfsym"
	"github.com/multiprobe/multiprobe/internal/fds"
)

// Retarget returns a plan of the same sites in another copy of the plan's
// binary, the file at path: the same library in another container, say.
// The copy is not resolved again, which for a large glob is most of the
// work; it must be the same build, with the binary's GNU build ID and size
// (else the error wraps ErrFileChanged; a binary without a build ID cannot
// be told apart, so its plans cannot be retargeted). The plan must be of
// one binary. pl may be closed; the new plan holds path open and has the
// same Options and cookies. Close it as any plan.
func (pl *Plan) Retarget(path string) (_ *Plan, err error) {
	if len(pl.files) != 1 {
		return nil, fmt.Errorf("%w: retargeting a plan of %d binaries: only a plan of one binary can be", ErrBadSpec, len(pl.files))
	}
	old := pl.files[0]
	if len(old.buildID) == 0 {
		return nil, fmt.Errorf("%s: no build ID, so another copy cannot be known for the same build: %w", old.path, ErrFileChanged)
	}
	f, err := fds.OpenRegular(path)
	if err != nil {
		return nil, err
	}
	of := &openFile{path: path, real: path, f: f}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	if err := unix.Fstat(int(f.Fd()), &of.st); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	ef, err := elfsym.OpenFile(f)
	if err != nil {
		return nil, err
	}
	of.buildID = ef.BuildID()
	ef.Close()
	if !bytes.Equal(of.buildID, old.buildID) || of.st.Size != old.st.Size {
		return nil, fmt.Errorf("%s (build ID %x, %d bytes) is not a copy of %s (build ID %x, %d bytes): %w",
			path, of.buildID, of.st.Size, old.path, old.buildID, old.st.Size, ErrFileChanged)
	}
	np := &Plan{opts: pl.opts, features: pl.features, files: []*openFile{of}, rows: pl.rows, usdt: pl.usdt, merged: pl.merged}
	// The planned probes and their rows are read-only after Resolve, so
	// the copy shares them but for the file and the probes, whose Target
	// the sites show.
	probes := map[*Probe]*Probe{}
	np.probes = make([]planned, len(pl.probes))
	for i, pp := range pl.probes {
		if probes[pp.probe] == nil {
			c := *pp.probe
			c.Target = path
			probes[pp.probe] = &c
		}
		pp.probe, pp.file = probes[pp.probe], of
		np.probes[i] = pp
	}
	return np, nil
}
