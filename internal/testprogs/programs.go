package testprogs

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/multiprobe/multiprobe/internal/prologue"
	"github.com/multiprobe/multiprobe/kernelprobe"
)

// MaxSites is the number of per-site slots in the BPF maps: cookies from 0
// to MaxSites-1 index them; events with larger cookies are only counted in
// OutOfRange.
const MaxSites = 1 << 18

// Counter holds the loaded counter programs (bpf/counter.c) and their maps.
// Every map except PIDCounts is an array indexed by the site's BPF cookie.
type Counter struct {
	// CountEntry is an entry probe: it increments Counts[cookie], stores the
	// caller's pid (tgid) in LastPID[cookie] and increments PIDCounts[pid].
	CountEntry *ebpf.Program
	// RecordReturn is a return probe: it increments RetCounts[cookie] and
	// stores the return value in RetValues[cookie].
	RecordReturn *ebpf.Program

	Counts     *ebpf.Map // uint32 cookie -> uint64 calls
	LastPID    *ebpf.Map // uint32 cookie -> uint32 pid
	RetCounts  *ebpf.Map // uint32 cookie -> uint64 returns
	RetValues  *ebpf.Map // uint32 cookie -> uint64 last return value
	PIDCounts  *ebpf.Map // uint32 pid -> uint64 calls (hash)
	OutOfRange *ebpf.Map // uint32 0 -> uint64 events with a cookie >= MaxSites

	objs counterObjects
}

// LoadCounter loads the counter programs for attach path p (see
// [kernelprobe.PrepareCollectionSpec]). The caller must Close the result.
func LoadCounter(p kernelprobe.Path) (*Counter, error) {
	spec, err := CounterSpec()
	if err != nil {
		return nil, err
	}
	kernelprobe.PrepareCollectionSpec(spec, p)
	if err := FixCookieWithoutKernelCookies(spec); err != nil {
		return nil, err
	}
	return NewCounter(spec)
}

// FixCookie sets bpf/mp_cookie.bpf.h's constants in spec so that
// mp_cookie returns cookie instead of calling bpf_get_attach_cookie: what
// Plan.Prepare and Plan.Attach do for each per-site clone on a kernel
// without BPF cookies, for tests that load programs without a plan.
func FixCookie(spec *ebpf.CollectionSpec, cookie uint64) error {
	for name, v := range map[string]any{"mp_cookie_fixed": true, "mp_cookie_value": cookie} {
		vs := spec.Variables[name]
		if vs == nil {
			return fmt.Errorf("testprogs: spec has no variable %s: does it include mp_cookie.bpf.h?", name)
		}
		if err := vs.Set(v); err != nil {
			return fmt.Errorf("testprogs: setting %s: %w", name, err)
		}
	}
	return nil
}

// FixCookieWithoutKernelCookies fixes the cookie to ~0 (none) on a kernel
// without BPF cookies (before Linux 5.15), where a program that may call
// bpf_get_attach_cookie does not load; elsewhere it does nothing.
func FixCookieWithoutKernelCookies(spec *ebpf.CollectionSpec) error {
	f, err := kernelprobe.Detect()
	if err != nil {
		return err
	}
	if f.Cookies {
		return nil
	}
	return FixCookie(spec, ^uint64(0))
}

// CounterSpec returns the counter object's collection spec, for a caller
// that prepares it (multiprobe's Plan.Prepare) before [NewCounter] loads it.
func CounterSpec() (*ebpf.CollectionSpec, error) {
	return loadCounter()
}

// NewCounter loads a spec from [CounterSpec]. The caller must Close the
// result.
func NewCounter(spec *ebpf.CollectionSpec) (*Counter, error) {
	// LoadAndAssign, as a bpf2go user loads: the maps that multiprobe
	// adds to a prepared spec (the pid filter's) need no field.
	c := &Counter{}
	if err := spec.LoadAndAssign(&c.objs, nil); err != nil {
		return nil, fmt.Errorf("testprogs: load counter: %w", err)
	}
	c.assign()
	return c, nil
}

// NewCounterSharing is NewCounter with Counts pinned by name in dir, a
// directory on a BPF file system: counters loaded so, by any process,
// count into one map (an agent's, killed, and the next one's). It sets
// the pinning in spec.
func NewCounterSharing(spec *ebpf.CollectionSpec, dir string) (*Counter, error) {
	m := spec.Maps["counts"]
	if m == nil {
		return nil, fmt.Errorf("testprogs: no counts map in the spec")
	}
	m.Pinning = ebpf.PinByName
	c := &Counter{}
	if err := spec.LoadAndAssign(&c.objs, &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: dir}}); err != nil {
		return nil, fmt.Errorf("testprogs: load counter: %w", err)
	}
	c.assign()
	return c, nil
}

func (c *Counter) assign() {
	o := &c.objs
	c.CountEntry, c.RecordReturn = o.CountEntry, o.RecordReturn
	c.Counts, c.LastPID, c.RetCounts, c.RetValues = o.Counts, o.LastPid, o.RetCounts, o.RetValues
	c.PIDCounts, c.OutOfRange = o.PidCounts, o.OutOfRange
}

// Close releases the programs and maps.
func (c *Counter) Close() error {
	return c.objs.Close()
}

// Session holds the loaded uprobe session program (bpf/session.c, Linux
// 6.13+) and its maps, all arrays indexed by the site's BPF cookie.
type Session struct {
	// CountSession increments Entries[cookie] at a site's entry and, at the
	// return, Returns[cookie], storing the return value in Values[cookie].
	CountSession *ebpf.Program

	Entries *ebpf.Map // uint32 cookie -> uint64 entries
	Returns *ebpf.Map // uint32 cookie -> uint64 returns
	Values  *ebpf.Map // uint32 cookie -> uint64 last return value

	objs sessionObjects
}

// LoadSession loads the session program. It fails on kernels without uprobe
// sessions. The caller must Close the result.
func LoadSession() (*Session, error) {
	s := &Session{}
	if err := loadSessionObjects(&s.objs, nil); err != nil {
		return nil, fmt.Errorf("testprogs: load session: %w", err)
	}
	o := &s.objs
	s.CountSession, s.Entries, s.Returns, s.Values = o.CountSession, o.SessionEntries, o.SessionReturns, o.SessionValues
	return s, nil
}

// Close releases the program and maps.
func (s *Session) Close() error { return s.objs.Close() }

// ReadArray returns entries 0 to n-1 of a BPF array map with uint64 values,
// such as [Counter.Counts].
func ReadArray(m *ebpf.Map, n int) ([]uint64, error) {
	if m == nil {
		return nil, errors.New("testprogs: nil map")
	}
	if n < 0 || uint32(n) > m.MaxEntries() {
		return nil, fmt.Errorf("testprogs: %d entries wanted from map %s of %d", n, m, m.MaxEntries())
	}
	out := make([]uint64, n)
	for i := range out {
		if err := m.Lookup(uint32(i), &out[i]); err != nil {
			return nil, fmt.Errorf("testprogs: map %s entry %d: %w", m, i, err)
		}
	}
	return out, nil
}

// CounterSpecV2 is CounterSpec with count_entry changed as a new version
// of an agent's program would be: it also counts its runs in out_of_range
// (a map of its own in each collection: OutOfRange tells which version
// ran), and otherwise counts as before. Its tag is not count_entry's.
func CounterSpecV2() (*ebpf.CollectionSpec, error) {
	spec, err := CounterSpec()
	if err != nil {
		return nil, err
	}
	prologue.Prepend(spec.Programs["count_entry"], asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.StoreImm(asm.RFP, -4, 0, asm.Word),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -4),
		asm.LoadMapPtr(asm.R1, 0).WithReference("out_of_range"),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "v2_body"),
		asm.Mov.Imm(asm.R1, 1),
		asm.StoreXAdd(asm.R0, asm.R1, asm.DWord),
		asm.Mov.Reg(asm.R1, asm.R6).WithSymbol("v2_body"),
	})
	return spec, nil
}
