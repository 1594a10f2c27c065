package multiprobe

import (
	"errors"

	"github.com/multiprobe/multiprobe/attach"
	"github.com/multiprobe/multiprobe/fallback"
	"github.com/multiprobe/multiprobe/internal/target"
)

// unit is the kernel links of one attach call: one kind of probe (entry or
// return), on either path, running the program copy of one generation
// (see Link.Update). An update keeps the units of binaries whose sites did
// not change, and splits them off the rest.
type unit struct {
	kind    Kind
	gen     uint32
	multi   *attach.Link   // uprobe_multi path
	perSite *fallback.Link // perf-event path
	files   []fileID       // the binary of each target, as Resolve found it
	pinDir  string         // where it is pinned, under the Link's directory
}

// targets are the unit's targets, with their cookies.
func (u *unit) targets() target.Targets {
	if u.multi != nil {
		return u.multi.Targets()
	}
	return u.perSite.Targets()
}

func (u *unit) pin(dir string) error {
	if u.multi != nil {
		return u.multi.Pin(dir)
	}
	return u.perSite.Pin(dir)
}

func (u *unit) pinAgain(dir string) error {
	if u.multi != nil {
		return u.multi.PinAgain(dir)
	}
	return u.perSite.PinAgain(dir)
}

func (u *unit) unpin() error {
	if u.multi != nil {
		return u.multi.Unpin()
	}
	return u.perSite.Unpin()
}

func (u *unit) close() error {
	if u.multi != nil {
		return u.multi.Close()
	}
	return u.perSite.Close()
}

func (u *unit) fds() int {
	if u.multi != nil {
		return u.multi.NumFDs()
	}
	return u.perSite.NumFDs()
}

// closeUnits closes units, the last first.
func closeUnits(units []*unit) error {
	var errs []error
	for i := len(units) - 1; i >= 0; i-- {
		errs = append(errs, units[i].close())
	}
	return errors.Join(errs...)
}
