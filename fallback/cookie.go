package fallback

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/multiprobe/multiprobe/attach"
	"github.com/multiprobe/multiprobe/internal/procmaps"
)

// Names of the objects bpf/cookie.bpf.h declares, which this package
// configures and fills.
const (
	// CookieMapName is the BPF hash from a site's runtime address (u64) to
	// its cookie (u64), read by mp_cookie() when the kernel has no BPF
	// cookies.
	CookieMapName = "mp_cookies"
	// NoCookieVariable is the const volatile bool in the program's .rodata
	// that makes mp_cookie() look the address up in CookieMapName instead
	// of calling bpf_get_attach_cookie, which needs Linux 5.15.
	NoCookieVariable = "mp_no_cookie"
	// DefaultMaxCookies is the size of CookieMapName as the header
	// declares it.
	DefaultMaxCookies = 4096
)

var (
	// ErrNoCookieMap: the kernel has no BPF cookies and Options.CookieMap
	// is nil, so the program could not tell the sites apart.
	ErrNoCookieMap = errors.New("no cookie map for a kernel without BPF cookies (Linux 5.15+): set Options.CookieMap to the program's " + CookieMapName + " map (include bpf/cookie.bpf.h)")
	// ErrNeedPID: without BPF cookies, the sites of a position-independent
	// binary (PIE executable or shared library) have no address until a
	// process maps it, so Options.PID must name one.
	ErrNeedPID = procmaps.ErrNeedPID
	// ErrNotMapped: the process Options.PID names does not map the site's
	// part of the binary (not loaded yet, or another binary).
	ErrNotMapped = procmaps.ErrNotMapped
	// ErrCookieConflict: a site's address is already in the cookie map,
	// from another attachment, or twice in one call with different cookies.
	ErrCookieConflict = errors.New("site address already has a cookie")
)

// CookieMapSpec returns the address-to-cookie map for maxSites sites.
func CookieMapSpec(maxSites uint32) *ebpf.MapSpec {
	return &ebpf.MapSpec{
		Name:       CookieMapName,
		Type:       ebpf.Hash,
		KeySize:    8,
		ValueSize:  8,
		MaxEntries: maxSites,
	}
}

// CollectionOptions are the load-time settings of a BPF object that
// includes bpf/cookie.bpf.h.
type CollectionOptions struct {
	// MaxSites resizes CookieMapName; 0 keeps the header's size
	// (DefaultMaxCookies). It bounds the sites attached at once without
	// cookies.
	MaxSites uint32
	// NoCookie makes mp_cookie() find the cookie by the probed address, for
	// kernels before 5.15 (kernelprobe.Features.Cookies false).
	NoCookie bool
}

// ConfigureCollection applies o to a collection spec before it is loaded,
// and checks that its cookie map has the layout this package writes.
func ConfigureCollection(cs *ebpf.CollectionSpec, o CollectionOptions) error {
	m, ok := cs.Maps[CookieMapName]
	if !ok {
		return fmt.Errorf("fallback: BPF object has no map %s: include bpf/cookie.bpf.h", CookieMapName)
	}
	if m.Type != ebpf.Hash || m.KeySize != 8 || m.ValueSize != 8 {
		return fmt.Errorf("fallback: map %s is %v with key/value size %d/%d, want Hash 8/8: object built with another cookie.bpf.h", CookieMapName, m.Type, m.KeySize, m.ValueSize)
	}
	if o.MaxSites != 0 {
		m.MaxEntries = o.MaxSites
	}
	v, ok := cs.Variables[NoCookieVariable]
	if !ok {
		return fmt.Errorf("fallback: BPF object has no variable %s: include bpf/cookie.bpf.h", NoCookieVariable)
	}
	if err := v.Set(o.NoCookie); err != nil {
		return fmt.Errorf("fallback: setting %s: %w", NoCookieVariable, err)
	}
	return nil
}

// cookieEntries are the keys one Link put into a cookie map.
type cookieEntries struct {
	m    *ebpf.Map
	keys []uint64
}

// fillCookies stores every site's cookie under its runtime address in m,
// all or nothing.
func fillCookies(m *ebpf.Map, ts []attach.Target, pid int) (*cookieEntries, error) {
	if m.KeySize() != 8 || m.ValueSize() != 8 {
		return nil, fmt.Errorf("fallback: cookie map %v has key/value size %d/%d, want 8/8 (the %s map of bpf/cookie.bpf.h)", m, m.KeySize(), m.ValueSize(), CookieMapName)
	}
	ce := &cookieEntries{m: m}
	seen := map[uint64]uint64{}
	for ti := range ts {
		t := &ts[ti]
		addrs, err := procmaps.RuntimeAddrs(t.Path, t.Offsets, pid)
		if err != nil {
			return nil, errors.Join(err, ce.remove())
		}
		for j, a := range addrs {
			c := t.Cookies[j]
			if prev, dup := seen[a]; dup {
				if prev == c {
					continue // an alias: both sites fire with one cookie
				}
				return nil, errors.Join(fmt.Errorf("fallback: %s: site %s at address %#x has cookie %d and %d; without BPF cookies one address has one cookie: %w",
					t.Path, attach.SiteName(t, j), a, prev, c, ErrCookieConflict), ce.remove())
			}
			seen[a] = c
			if err := m.Update(a, c, ebpf.UpdateNoExist); err != nil {
				if errors.Is(err, ebpf.ErrKeyExist) {
					err = fmt.Errorf("%w (attached twice into one map?)", ErrCookieConflict)
				}
				return nil, errors.Join(fmt.Errorf("fallback: %s: site %s: storing cookie under address %#x in %v: %w",
					t.Path, attach.SiteName(t, j), a, m, err), ce.remove())
			}
			ce.keys = append(ce.keys, a)
		}
	}
	return ce, nil
}

// remove deletes the entries ce put into the map.
func (ce *cookieEntries) remove() error {
	var errs []error
	for _, k := range ce.keys {
		if err := ce.m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("fallback: removing address %#x from %v: %w", k, ce.m, err))
		}
	}
	ce.keys = nil
	return errors.Join(errs...)
}
