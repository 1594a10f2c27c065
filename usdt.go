package multiprobe

import (
	"debug/elf"
	"fmt"
	"sync"

	"github.com/cilium/ebpf"

	"github.com/multiprobe/multiprobe/elfsym"
	"github.com/multiprobe/multiprobe/internal/procmaps"
	"github.com/multiprobe/multiprobe/usdt"
)

// ErrNeedPID is returned when sites in a position-independent file are
// attached without BPF cookies and without a pid: the probed address the
// program then keys its lookup by depends on where each process loaded the
// file.
var ErrNeedPID = procmaps.ErrNeedPID

// resolveUSDT returns the sites of the USDT probes that p selects in the
// file at path. Each site's spec is decoded now, when the host can use it,
// so that attaching only hands out ids.
func resolveUSDT(path string, p *Probe) ([]Site, error) {
	f, err := usdt.Open(path)
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
				Site: &elfsym.Site{
					Name:    pr.Provider + ":" + pr.Name,
					Bind:    elf.STB_GLOBAL,
					Type:    elf.STT_NOTYPE,
					Address: us.Address,
					Offset:  us.Offset,
				},
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

// specTables holds one usdt.SpecTable per spec map, shared by every Link
// that uses the map, so that equal specs share an id and an id freed by
// one Link's Close is reused by the next attach. A map is known by its
// kernel ID, so that two handles to it (a pinned map opened twice, a
// Clone) share one id space; the table writes through a handle of its own.
var specTables struct {
	sync.Mutex
	m map[any]*specTable // by ebpf.MapID, or by handle without IDs (before 4.13)
}

type specTable struct {
	*usdt.SpecTable
	key   any
	m     *ebpf.Map
	users int
}

func acquireSpecTable(m *ebpf.Map) (*specTable, error) {
	var key any = m
	if info, err := m.Info(); err == nil {
		if id, ok := info.ID(); ok {
			key = id
		}
	}
	specTables.Lock()
	defer specTables.Unlock()
	if specTables.m == nil {
		specTables.m = map[any]*specTable{}
	}
	t := specTables.m[key]
	if t == nil {
		own, err := m.Clone()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", usdt.SpecMapName, err)
		}
		t = &specTable{key: key, m: own}
		t.SpecTable = usdt.NewSpecTable(own.MaxEntries(), func(id uint32, s *usdt.Spec) error {
			b, err := s.MarshalBinary()
			if err != nil {
				return err
			}
			return own.Put(id, b)
		})
		specTables.m[key] = t
	}
	t.users++
	return t, nil
}

func releaseSpecTable(t *specTable) {
	specTables.Lock()
	defer specTables.Unlock()
	if t.users--; t.users == 0 {
		delete(specTables.m, t.key)
		t.m.Close()
	}
}

// usdtState is what a Link holds for its USDT sites: the spec ids to
// release and the address map entries to delete on Close.
type usdtState struct {
	specs *ebpf.Map
	table *specTable
	ids   []uint32
	ips   *ebpf.Map
	keys  []uint64
}

// prepareUSDT gives every USDT site a spec id and its kernel cookie
// (spec id and user cookie packed), and, without cookies, writes the
// address map. cookies[i] is the cookie to attach sites[i] with; nil means
// every site keeps its Cookie.
func prepareUSDT(sites []Site, opts *Options, haveCookies bool) (cookies []uint64, st *usdtState, err error) {
	hasUSDT := false
	for _, s := range sites {
		if s.USDT != nil {
			hasUSDT = true
			if s.args.err != nil {
				return nil, nil, s.args.err
			}
		}
	}
	if !hasUSDT {
		return nil, nil, nil
	}
	specs, ips := opts.Maps[usdt.SpecMapName], opts.Maps[usdt.IPMapName]
	if specs == nil {
		// The program does not read arguments: the sites keep their
		// plain cookies, which mp_usdt_cookie reads as well.
		return nil, nil, nil
	}
	cookies = make([]uint64, len(sites))
	for i, s := range sites {
		cookies[i] = s.Cookie
	}
	table, err := acquireSpecTable(specs)
	if err != nil {
		return nil, nil, err
	}
	st = &usdtState{specs: specs, table: table, ips: ips}
	defer func() {
		if err != nil {
			st.release()
			st = nil
		}
	}()
	if !haveCookies && st.ips == nil {
		return nil, nil, fmt.Errorf("kernel without BPF cookies: USDT probes need the program's %s map (Options.Maps)", usdt.IPMapName)
	}
	var byPath map[string][]int // sites to look up by address, per file
	for i, s := range sites {
		if s.USDT == nil {
			continue
		}
		id, err := st.table.Acquire(s.args.spec)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", s.Name, err)
		}
		st.ids = append(st.ids, id)
		cookies[i] = usdt.PackCookie(id, uint32(s.Cookie))
		if !haveCookies {
			if byPath == nil {
				byPath = map[string][]int{}
			}
			byPath[s.Path] = append(byPath[s.Path], i)
		}
	}
	for path, idx := range byPath {
		offs := make([]uint64, len(idx))
		for j, i := range idx {
			offs[j] = sites[i].Offset
		}
		addrs, err := procmaps.RuntimeAddrs(path, offs, opts.PID)
		if err != nil {
			return nil, nil, err
		}
		for j, i := range idx {
			if err := st.ips.Put(addrs[j], cookies[i]); err != nil {
				return nil, nil, fmt.Errorf("%s: writing %s: %w", sites[i].Name, usdt.IPMapName, err)
			}
			st.keys = append(st.keys, addrs[j])
		}
	}
	return cookies, st, nil
}

// release frees the spec ids and address entries; call it after the sites
// are detached, so that no site fires with a freed id.
func (st *usdtState) release() {
	if st == nil {
		return
	}
	for _, k := range st.keys {
		_ = st.ips.Delete(k)
	}
	for _, id := range st.ids {
		st.table.Release(id)
	}
	releaseSpecTable(st.table)
	st.ids, st.keys = nil, nil
}
