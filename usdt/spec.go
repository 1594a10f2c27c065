package usdt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"sync"

	"github.com/cilium/ebpf"
)

// SpecArg is one argument of a Spec, the Go mirror of struct mp_usdt_arg
// in bpf/usdt.bpf.h. Field order and sizes are the wire layout; a test
// checks them against the BTF of a compiled BPF object.
type SpecArg struct {
	// Value is the constant, or the displacement of a memory operand.
	Value int64
	// RegOffset and IndexOffset are pt_regs offsets, -1 for none.
	RegOffset   int16
	IndexOffset int16
	Kind        ArgKind
	// Size is 1, 2, 4 or 8.
	Size uint8
	// Signed is 1 when the value is sign-extended from Size bytes.
	Signed uint8
	// ScaleShift is log2 of the index scale (0..3).
	ScaleShift uint8
}

// Spec tells the BPF side how to read every argument of a probe site: the
// Go mirror of struct mp_usdt_spec in bpf/usdt.bpf.h, the value type of
// the SpecMapName map. Spec is comparable, so it can key a map.
type Spec struct {
	Args     [MaxArgs]SpecArg
	ArgCount uint32
	pad      uint32 //nolint:unused // the C struct's reserved word
}

// SpecSize is the size of struct mp_usdt_spec and of Spec's encoding.
const SpecSize = MaxArgs*16 + 8

// Names of the objects bpf/usdt.bpf.h declares, which multiprobe fills.
const (
	// SpecMapName is the BPF array of Spec values, indexed by spec id.
	SpecMapName = "mp_usdt_specs"
	// IPMapName is the BPF hash used when the kernel has no BPF cookies:
	// key the probed address as the target process sees it (a u64: the
	// site's Address plus the load bias of the mapping, 0 for a non-PIE
	// executable), value the packed cookie (see PackCookie).
	IPMapName = "mp_usdt_ips"
	// NoCookieVariable is the const volatile bool in the program's
	// .rodata that selects the IPMapName lookup instead of
	// bpf_get_attach_cookie, which needs Linux 5.15.
	NoCookieVariable = "mp_usdt_no_cookie"
)

// ipOffsetVariable holds the pt_regs offset of the instruction pointer.
const ipOffsetVariable = "mp_usdt_ip_off"

// Default capacities of the two maps, as the header declares them.
const (
	DefaultMaxSpecs = 1024
	DefaultMaxIPs   = 4096
)

// NewSpec encodes decoded arguments as a Spec. The register offsets in
// args are those of the binary's architecture; use File.Spec to also check
// that it is the host's.
func NewSpec(args []Arg) (Spec, error) {
	var s Spec
	if len(args) > MaxArgs {
		return s, fmt.Errorf("%w: %d arguments, at most %d", ErrBadArgSpec, len(args), MaxArgs)
	}
	for i, a := range args {
		sa := SpecArg{Value: a.Value, RegOffset: a.RegOffset, IndexOffset: a.IndexOffset, Kind: a.Kind, Size: uint8(a.Size)}
		if a.Signed {
			sa.Signed = 1
		}
		switch a.Size {
		case 1, 2, 4, 8:
		default:
			return Spec{}, fmt.Errorf("%w %q: size %d", ErrBadArgSpec, a.Spec, a.Size)
		}
		switch a.Kind {
		case ArgConst:
		case ArgReg:
			if a.RegOffset < 0 {
				return Spec{}, fmt.Errorf("%w %q: register argument without a register", ErrBadArgSpec, a.Spec)
			}
		case ArgMem:
		case ArgSIB:
			switch a.Scale {
			case 1, 2, 4, 8:
				sa.ScaleShift = uint8(bits.TrailingZeros8(a.Scale))
			default:
				return Spec{}, fmt.Errorf("%w %q: scale %d", ErrBadArgSpec, a.Spec, a.Scale)
			}
			if a.IndexOffset < 0 {
				return Spec{}, fmt.Errorf("%w %q: indexed argument without an index register", ErrBadArgSpec, a.Spec)
			}
		default:
			return Spec{}, fmt.Errorf("%w %q: kind %s", ErrBadArgSpec, a.Spec, a.Kind)
		}
		s.Args[i] = sa
	}
	s.ArgCount = uint32(len(args))
	return s, nil
}

// Spec returns the Spec of a site of this file, for attaching on this
// host. It fails with ErrUnsupportedArch for a binary of another
// architecture and with the site's ArgErr for an undecodable string.
func (f *File) Spec(site Site) (Spec, error) {
	if f.Arch != HostArch() {
		return Spec{}, fmt.Errorf("usdt: %s: %w: binary is %s, host is %s", f.Path, ErrUnsupportedArch, f.Arch, HostArch())
	}
	if site.ArgErr != nil {
		return Spec{}, site.ArgErr
	}
	s, err := NewSpec(site.Args)
	if err != nil {
		return Spec{}, fmt.Errorf("usdt: %s: site %#x: %w", f.Path, site.Address, err)
	}
	return s, nil
}

// MarshalBinary encodes s in the host's byte order, as a BPF map value.
func (s Spec) MarshalBinary() ([]byte, error) {
	return s.AppendBinary(make([]byte, 0, SpecSize))
}

// AppendBinary appends the encoding of s to b.
func (s Spec) AppendBinary(b []byte) ([]byte, error) {
	ne := binary.NativeEndian
	for _, a := range s.Args {
		b = ne.AppendUint64(b, uint64(a.Value))
		b = ne.AppendUint16(b, uint16(a.RegOffset))
		b = ne.AppendUint16(b, uint16(a.IndexOffset))
		b = append(b, byte(a.Kind), a.Size, a.Signed, a.ScaleShift)
	}
	b = ne.AppendUint32(b, s.ArgCount)
	b = ne.AppendUint32(b, 0)
	return b, nil
}

// UnmarshalBinary decodes a Spec written by MarshalBinary or by BPF.
func (s *Spec) UnmarshalBinary(b []byte) error {
	if len(b) != SpecSize {
		return fmt.Errorf("usdt: spec of %d bytes, want %d", len(b), SpecSize)
	}
	ne := binary.NativeEndian
	for i := range s.Args {
		p := b[i*16:]
		s.Args[i] = SpecArg{
			Value:       int64(ne.Uint64(p)),
			RegOffset:   int16(ne.Uint16(p[8:])),
			IndexOffset: int16(ne.Uint16(p[10:])),
			Kind:        ArgKind(p[12]),
			Size:        p[13],
			Signed:      p[14],
			ScaleShift:  p[15],
		}
	}
	s.ArgCount = ne.Uint32(b[MaxArgs*16:])
	s.pad = 0
	return nil
}

// PackCookie returns the BPF cookie of a site: the spec id in the upper
// 32 bits and the user's cookie in the lower 32, which is all of it a
// USDT program sees (mp_usdt_cookie).
func PackCookie(specID, user uint32) uint64 {
	return uint64(specID)<<32 | uint64(user)
}

// UnpackCookie splits a cookie made by PackCookie.
func UnpackCookie(cookie uint64) (specID, user uint32) {
	return uint32(cookie >> 32), uint32(cookie)
}

// SpecMapSpec returns the spec table map for maxSpecs specs: an array
// indexed by spec id. Id 0 is never handed out, so that a site attached
// without a cookie reads an empty spec (no arguments) instead of another
// probe's.
func SpecMapSpec(maxSpecs uint32) *ebpf.MapSpec {
	return &ebpf.MapSpec{
		Name:       SpecMapName,
		Type:       ebpf.Array,
		KeySize:    4,
		ValueSize:  SpecSize,
		MaxEntries: maxSpecs,
	}
}

// IPMapSpec returns the address-to-cookie map for maxSites sites, used
// when the kernel has no BPF cookies (see IPMapName).
func IPMapSpec(maxSites uint32) *ebpf.MapSpec {
	return &ebpf.MapSpec{
		Name:       IPMapName,
		Type:       ebpf.Hash,
		KeySize:    8,
		ValueSize:  8,
		MaxEntries: maxSites,
	}
}

// CollectionOptions are the load-time settings of a BPF object that
// includes bpf/usdt.bpf.h.
type CollectionOptions struct {
	// MaxSpecs and MaxIPs resize the two maps; 0 keeps the header's size.
	MaxSpecs uint32
	MaxIPs   uint32
	// NoCookie makes the programs find their spec through the probed
	// address, for kernels before 5.15 without bpf_get_attach_cookie.
	NoCookie bool
}

// ConfigureCollection applies o to a collection spec before it is loaded,
// and checks that its spec map has the layout this package writes, which
// catches an object built against another version of the header.
func ConfigureCollection(cs *ebpf.CollectionSpec, o CollectionOptions) error {
	m, ok := cs.Maps[SpecMapName]
	if !ok {
		return fmt.Errorf("usdt: BPF object has no map %s: include usdt.bpf.h", SpecMapName)
	}
	if m.ValueSize != SpecSize || m.KeySize != 4 {
		return fmt.Errorf("usdt: map %s has key/value size %d/%d, want 4/%d: object built with another usdt.bpf.h", SpecMapName, m.KeySize, m.ValueSize, SpecSize)
	}
	if o.MaxSpecs != 0 {
		m.MaxEntries = o.MaxSpecs
	}
	if ip, ok := cs.Maps[IPMapName]; ok && o.MaxIPs != 0 {
		ip.MaxEntries = o.MaxIPs
	}
	v, ok := cs.Variables[NoCookieVariable]
	if !ok {
		return fmt.Errorf("usdt: BPF object has no variable %s: include usdt.bpf.h", NoCookieVariable)
	}
	if err := v.Set(o.NoCookie); err != nil {
		return fmt.Errorf("usdt: setting %s: %w", NoCookieVariable, err)
	}
	if !o.NoCookie {
		return nil
	}
	// The header knows the instruction pointer's offset only when built
	// with __TARGET_ARCH_*; the host's is the right one in any case.
	ipv, ok := cs.Variables[ipOffsetVariable]
	if !ok {
		return fmt.Errorf("usdt: BPF object has no variable %s: include usdt.bpf.h", ipOffsetVariable)
	}
	off := ipOffset(HostArch())
	if off < 0 {
		return fmt.Errorf("usdt: %w: host %s", ErrUnsupportedArch, HostArch())
	}
	if err := ipv.Set(int32(off)); err != nil {
		return fmt.Errorf("usdt: setting %s: %w", ipOffsetVariable, err)
	}
	return nil
}

// ErrTooManySpecs is returned by SpecTable.Acquire when every id is taken.
var ErrTooManySpecs = errors.New("too many distinct USDT argument specs")

// SpecTable hands out spec ids: one per distinct Spec while any attachment
// uses it, freed when the last one releases it, then reused. It is safe
// for concurrent use.
type SpecTable struct {
	mu    sync.Mutex
	max   uint32
	store func(id uint32, s *Spec) error
	ids   map[Spec]uint32
	byID  map[uint32]*specRef
	free  []uint32
	next  uint32
}

type specRef struct {
	spec Spec
	refs uint32
}

// NewSpecTable returns a table of ids 1..maxSpecs-1 (the map's size; id 0
// is reserved, see SpecMapSpec). store, if not nil, writes a new spec into
// the BPF map; it runs before Acquire returns the id, so no site can fire
// with an id whose spec is not yet there.
func NewSpecTable(maxSpecs uint32, store func(id uint32, s *Spec) error) *SpecTable {
	return &SpecTable{
		max:   maxSpecs,
		store: store,
		ids:   make(map[Spec]uint32),
		byID:  make(map[uint32]*specRef),
		next:  1,
	}
}

// Acquire returns the id of s, taking a reference on it.
func (t *SpecTable) Acquire(s Spec) (uint32, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if id, ok := t.ids[s]; ok {
		t.byID[id].refs++
		return id, nil
	}
	var id uint32
	switch {
	case len(t.free) > 0:
		id = t.free[len(t.free)-1]
		t.free = t.free[:len(t.free)-1]
	case t.next < t.max:
		id = t.next
		t.next++
	default:
		return 0, fmt.Errorf("usdt: %w: all %d ids in use (raise the size of map %s)", ErrTooManySpecs, max(t.max, 1)-1, SpecMapName)
	}
	if t.store != nil {
		if err := t.store(id, &s); err != nil {
			t.free = append(t.free, id)
			return 0, fmt.Errorf("usdt: writing spec %d to %s: %w", id, SpecMapName, err)
		}
	}
	t.ids[s] = id
	t.byID[id] = &specRef{spec: s, refs: 1}
	return id, nil
}

// Release drops a reference taken by Acquire and reports whether it was
// the last one, so that the id is free again. Releasing an id that is not
// held does nothing.
func (t *SpecTable) Release(id uint32) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.byID[id]
	if !ok {
		return false
	}
	if r.refs--; r.refs > 0 {
		return false
	}
	delete(t.byID, id)
	delete(t.ids, r.spec)
	t.free = append(t.free, id)
	return true
}

// Len returns how many ids are in use.
func (t *SpecTable) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byID)
}
