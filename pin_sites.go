package multiprobe

import (
	"fmt"

	"github.com/multiprobe/multiprobe/usdt"
)

// siteColumns is the manifest's site table as it is stored: a column per
// field, and the fields most sites leave empty as maps by site index.
// Decoding arrays of numbers is several times faster than decoding an
// object per site, and a restarting agent waits for it (BenchmarkPinned:
// 10,000 sites).
type siteColumns struct {
	Probes []Probe            `json:"probes"`
	Paths  []string           `json:"paths"`
	Name   []string           `json:"name"`
	Offset []uint64           `json:"offset"`
	Probe  []int              `json:"probe"`
	Path   []int              `json:"path"`
	Cookie []uint64           `json:"cookie"`
	Moved  []uint8            `json:"moved"`
	Sym    []bool             `json:"sym"` // the site has a symbol
	Names  map[int][]string   `json:"names,omitempty"`
	Note   map[int]string     `json:"note,omitempty"`
	Ret    map[int][]uint64   `json:"returns,omitempty"`
	RefCtr map[int]uint64     `json:"ref_ctr,omitempty"`
	USDT   map[int]*usdt.Site `json:"usdt,omitempty"`

	// The symbols' columns, one entry per site with Sym set.
	SymSize    []uint64         `json:"sym_size"`
	SymAddress []uint64         `json:"sym_address"`
	SymOffset  []uint64         `json:"sym_symbol_offset"`
	SymBind    []uint8          `json:"sym_bind"`
	SymType    []uint8          `json:"sym_type"`
	SymMoved   []uint8          `json:"sym_moved"`
	SymName    map[int]string   `json:"sym_name,omitempty"`
	SymAt      map[int]uint64   `json:"sym_offset,omitempty"`
	SymNote    map[int]string   `json:"sym_note,omitempty"`
	SymAliases map[int][]string `json:"sym_aliases,omitempty"`
	SymVersion map[int]string   `json:"sym_version,omitempty"`
}

// setIf sets m[k] = v unless v is empty, making m first.
func setIf[V any](m *map[int]V, k int, v V, empty bool) {
	if empty {
		return
	}
	if *m == nil {
		*m = map[int]V{}
	}
	(*m)[k] = v
}

func toColumns(probes []Probe, paths []string, sites []pinnedSite) siteColumns {
	c := siteColumns{Probes: probes, Paths: paths}
	for i, s := range sites {
		c.Name = append(c.Name, s.Name)
		c.Offset = append(c.Offset, s.Offset)
		c.Probe = append(c.Probe, s.Probe)
		c.Path = append(c.Path, s.Path)
		c.Cookie = append(c.Cookie, s.Cookie)
		c.Moved = append(c.Moved, s.Moved)
		c.Sym = append(c.Sym, s.Symbol != nil)
		setIf(&c.Names, i, s.Names, s.Names == nil)
		setIf(&c.Note, i, s.Note, s.Note == "")
		setIf(&c.Ret, i, s.Returns, s.Returns == nil)
		setIf(&c.RefCtr, i, s.RefCtr, s.RefCtr == 0)
		setIf(&c.USDT, i, s.USDT, s.USDT == nil)
		if y := s.Symbol; y != nil {
			c.SymSize = append(c.SymSize, y.Size)
			c.SymAddress = append(c.SymAddress, y.Address)
			c.SymOffset = append(c.SymOffset, y.SymbolOffset)
			c.SymBind = append(c.SymBind, y.Bind)
			c.SymType = append(c.SymType, y.Type)
			c.SymMoved = append(c.SymMoved, y.Moved)
			setIf(&c.SymName, i, y.Name, y.Name == "")
			setIf(&c.SymAt, i, y.Offset, y.Offset == 0)
			setIf(&c.SymNote, i, y.Note, y.Note == "")
			setIf(&c.SymAliases, i, y.Aliases, y.Aliases == nil)
			setIf(&c.SymVersion, i, y.Version, y.Version == "")
		}
	}
	return c
}

// sites turns the columns back into sites, refusing columns of different
// lengths.
func (c *siteColumns) sites() ([]pinnedSite, error) {
	n := len(c.Name)
	if len(c.Offset) != n || len(c.Probe) != n || len(c.Path) != n || len(c.Cookie) != n || len(c.Moved) != n || len(c.Sym) != n {
		return nil, fmt.Errorf("manifest: site columns of different lengths: %w", ErrNotPinned)
	}
	nsym := 0
	for _, has := range c.Sym {
		if has {
			nsym++
		}
	}
	if len(c.SymSize) != nsym || len(c.SymAddress) != nsym || len(c.SymOffset) != nsym ||
		len(c.SymBind) != nsym || len(c.SymType) != nsym || len(c.SymMoved) != nsym {
		return nil, fmt.Errorf("manifest: symbol columns of different lengths: %w", ErrNotPinned)
	}
	out := make([]pinnedSite, n)
	syms := make([]pinnedSymbol, nsym)
	k := 0
	for i := range out {
		out[i] = pinnedSite{
			Name: c.Name[i], Names: c.Names[i], Offset: c.Offset[i], Probe: c.Probe[i], Path: c.Path[i], Cookie: c.Cookie[i],
			Moved: c.Moved[i], Note: c.Note[i], Returns: c.Ret[i], RefCtr: c.RefCtr[i], USDT: c.USDT[i],
		}
		if c.Sym[i] {
			syms[k] = pinnedSymbol{
				Name: c.SymName[i], Aliases: c.SymAliases[i], Version: c.SymVersion[i], Bind: c.SymBind[k], Type: c.SymType[k],
				Size: c.SymSize[k], Address: c.SymAddress[k], Offset: c.SymAt[i], SymbolOffset: c.SymOffset[k], Moved: c.SymMoved[k], Note: c.SymNote[i],
			}
			out[i].Symbol = &syms[k]
			k++
		}
	}
	return out, nil
}
