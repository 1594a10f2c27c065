package multiprobe

import (
	"fmt"

	"github.com/multiprobe/multiprobe/usdt"
)

// usdtArgs are the arguments of a USDT site, or why they cannot be read.
type usdtArgs struct {
	spec usdt.Spec
	err  error
}

// resolveUSDT returns the sites of the USDT probes that p selects in the
// open file of. Each site's spec is decoded now, when the host can use it,
// so that attaching only hands out ids.
func resolveUSDT(of *openFile, p *Probe) ([]Site, error) {
	// The parsers read the file Resolve opened, whatever has happened to
	// its path since, and name it as the probe does.
	f, err := usdt.OpenFile(of.f)
	if err != nil {
		return nil, err
	}
	probes, err := f.Probes(p.Patterns[0])
	if err != nil {
		return nil, err
	}
	var sites []Site
	for _, pr := range probes {
		for i := range pr.Sites {
			us := &pr.Sites[i]
			s := Site{
				Name:         pr.Provider + ":" + pr.Name,
				Offset:       us.Offset,
				RefCtrOffset: us.SemaphoreOffset,
				USDT:         us,
			}
			spec, err := f.Spec(*us)
			if err != nil {
				err = fmt.Errorf("%s at %#x: %w", s.Name, us.Address, err)
			}
			s.args = &usdtArgs{spec: spec, err: err}
			sites = append(sites, s)
		}
	}
	return sites, nil
}
