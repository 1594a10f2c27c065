package usdt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"os"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/multiprobe/multiprobe/internal/maplock"
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
	// pad stands for the C struct's refs, which AcquireSpecs owns: it
	// is always zero in a Spec, so that equal specs compare equal.
	pad uint32 //nolint:unused
}

// SpecSize is the size of struct mp_usdt_spec and of Spec's encoding.
const SpecSize = MaxArgs*16 + 8

// SpecMapName is the BPF array of Spec values, indexed by spec id, that
// bpf/mp_usdt.bpf.h declares and multiprobe fills.
const SpecMapName = "mp_usdt_specs"

// DefaultMaxSpecs is the spec map's capacity as the header declares it.
const DefaultMaxSpecs = 1024

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

// CollectionOptions are the load-time settings of a BPF object that
// includes bpf/mp_usdt.bpf.h.
type CollectionOptions struct {
	// MaxSpecs resizes the spec map; 0 keeps the header's size.
	MaxSpecs uint32
}

// ConfigureCollection applies o to a collection spec before it is loaded,
// and checks that its spec map has the layout this package writes, which
// catches an object built against another version of the header.
func ConfigureCollection(cs *ebpf.CollectionSpec, o CollectionOptions) error {
	m, ok := cs.Maps[SpecMapName]
	if !ok {
		return fmt.Errorf("usdt: BPF object has no map %s: include mp_usdt.bpf.h: %w", SpecMapName, ErrBadSpecMap)
	}
	if err := checkSpecMap(m.Type, m.KeySize, m.ValueSize); err != nil {
		return err
	}
	if o.MaxSpecs != 0 {
		m.MaxEntries = o.MaxSpecs
	}
	return nil
}

var (
	// ErrTooManySpecs is returned by AcquireSpecs when every id is taken.
	ErrTooManySpecs = errors.New("too many distinct USDT argument specs")
	// ErrBadSpecMap: the spec map is missing or has another layout than
	// this version of the package writes.
	ErrBadSpecMap = errors.New("USDT spec map does not match this version of mp_usdt.bpf.h")
)

func checkSpecMap(t ebpf.MapType, key, value uint32) error {
	if t != ebpf.Array || key != 4 || value != SpecSize {
		return fmt.Errorf("usdt: map %s is %v with key/value size %d/%d, want an array of 4/%d: object built with another mp_usdt.bpf.h: %w", SpecMapName, t, key, value, SpecSize, ErrBadSpecMap)
	}
	return nil
}

// SpecIDs are the spec ids that one holder (for example one multiprobe
// Link) took in a spec map with [AcquireSpecs], one per site.
//
// The map itself is the record of who holds what: every entry's last word
// (the C struct's refs) counts the holders of that spec, so that holders
// that share a map (several links of one loaded program) share ids for
// equal specs, and an id is reused only after its last holder released
// it. Id 0 is never handed out, so a site attached without a spec id
// reads an empty spec (no arguments) instead of another probe's.
// Holders in one process serialise on the map's kernel id; processes that
// share a pinned spec map must not acquire at once.
type SpecIDs struct {
	m        *ebpf.Map     // a clone, owned
	mu       *maplock.Hold // shared by every holder of the map in the process
	ids      []uint32
	distinct []uint32
}

// AcquireSpecs takes one reference on each distinct spec of specs in the
// loaded spec map m, writing the specs that are not there yet into free
// ids, and returns the ids, one per element of specs. It is all or
// nothing. The result holds its own handle of m; Release it.
func AcquireSpecs(m *ebpf.Map, specs []Spec) (*SpecIDs, error) {
	if m == nil {
		return nil, fmt.Errorf("usdt: nil spec map: %w", ErrBadSpecMap)
	}
	if err := checkSpecMap(m.Type(), m.KeySize(), m.ValueSize()); err != nil {
		return nil, err
	}
	s := &SpecIDs{}
	if err := s.hold(m); err != nil {
		return nil, err
	}
	if err := s.acquire(specs); err != nil {
		s.m.Close()
		s.mu.Release()
		return nil, err
	}
	return s, nil
}

// hold takes a handle of m of s's own, and the lock of the reference
// counts' read-modify-write that every holder of m in the process shares.
func (s *SpecIDs) hold(m *ebpf.Map) error {
	mu, err := maplock.For(m)
	if err != nil {
		return fmt.Errorf("usdt: %s: %w", SpecMapName, err)
	}
	own, err := m.Clone()
	if err != nil {
		mu.Release()
		return fmt.Errorf("usdt: %s: %w", SpecMapName, err)
	}
	s.m, s.mu = own, mu
	return nil
}

func (s *SpecIDs) acquire(specs []Spec) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	table, refs, err := readSpecs(s.m)
	if err != nil {
		return err
	}
	byspec := make(map[Spec]uint32, len(specs))
	for id := 1; id < len(table); id++ {
		if refs[id] > 0 {
			byspec[table[id]] = uint32(id)
		}
	}
	taken := make(map[uint32]bool)
	next := 1
	undo := func() {
		for _, id := range s.distinct {
			if refs[id]--; refs[id] == 0 {
				table[id] = Spec{}
			}
			_ = writeSpec(s.m, id, table[id], refs[id])
		}
		s.distinct = nil
	}
	s.ids = make([]uint32, len(specs))
	for i, sp := range specs {
		sp.pad = 0
		id, ok := byspec[sp]
		if !ok {
			for next < len(table) && refs[next] > 0 {
				next++
			}
			if next >= len(table) {
				undo()
				return fmt.Errorf("usdt: %w: all %d ids of map %s in use (raise its size with CollectionOptions.MaxSpecs or MP_USDT_MAX_SPECS)", ErrTooManySpecs, max(len(table), 1)-1, SpecMapName)
			}
			id = uint32(next)
			table[id] = sp
			byspec[sp] = id
		}
		s.ids[i] = id
		if !taken[id] {
			taken[id] = true
			refs[id]++
			if err := writeSpec(s.m, id, table[id], refs[id]); err != nil {
				refs[id]--
				undo()
				return err
			}
			s.distinct = append(s.distinct, id)
		}
	}
	return nil
}

// IDs returns the spec id of each spec given to AcquireSpecs, in order.
func (s *SpecIDs) IDs() []uint32 { return s.ids }

// Release drops the references. An id whose last holder this was is
// cleared, so that a stale site reads no arguments rather than another
// probe's. Release is idempotent.
func (s *SpecIDs) Release() error {
	if s == nil || s.m == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, id := range s.distinct {
		var raw [SpecSize]byte
		if err := s.m.Lookup(id, raw[:]); err != nil {
			errs = append(errs, fmt.Errorf("usdt: reading spec %d of %s: %w", id, SpecMapName, err))
			continue
		}
		var sp Spec
		_ = sp.UnmarshalBinary(raw[:])
		refs := binary.NativeEndian.Uint32(raw[SpecSize-4:])
		if refs > 0 {
			refs--
		}
		if refs == 0 {
			sp = Spec{}
		}
		errs = append(errs, writeSpec(s.m, id, sp, refs))
	}
	s.distinct, s.ids = nil, nil
	errs = append(errs, s.m.Close())
	s.m = nil
	s.mu.Release()
	return errors.Join(errs...)
}

// readSpecs reads the whole spec map: its specs and reference counts.
func readSpecs(m *ebpf.Map) ([]Spec, []uint32, error) {
	n := m.MaxEntries()
	table := make([]Spec, n)
	refs := make([]uint32, n)
	var (
		key uint32
		raw = make([]byte, SpecSize)
	)
	it := m.Iterate()
	for it.Next(&key, raw) {
		if key >= n {
			continue
		}
		if err := table[key].UnmarshalBinary(raw); err != nil {
			return nil, nil, err
		}
		refs[key] = binary.NativeEndian.Uint32(raw[SpecSize-4:])
	}
	if err := it.Err(); err != nil {
		return nil, nil, fmt.Errorf("usdt: reading %s: %w", SpecMapName, err)
	}
	return table, refs, nil
}

func writeSpec(m *ebpf.Map, id uint32, sp Spec, refs uint32) error {
	b, _ := sp.AppendBinary(make([]byte, 0, SpecSize))
	binary.NativeEndian.PutUint32(b[SpecSize-4:], refs)
	if err := m.Update(id, b, ebpf.UpdateExist); err != nil {
		return fmt.Errorf("usdt: writing spec %d to %s: %w", id, SpecMapName, err)
	}
	return nil
}

// Close drops s's handle of the map and keeps its references, for a holder
// whose sites stay attached after it is gone (a pinned multiprobe Link):
// HeldSpecs takes them back. Close and Release are idempotent, and after
// either the other does nothing.
func (s *SpecIDs) Close() error {
	if s == nil || s.m == nil {
		return nil
	}
	err := s.m.Close()
	s.m, s.ids, s.distinct = nil, nil, nil
	s.mu.Release()
	return err
}

// HeldSpecs takes back the references that a holder, now gone, took with
// AcquireSpecs and kept with Close: ids are its IDs. Each id must still be
// held in m. The result holds its own handle of m; Release it, or Close
// it to keep the references again.
func HeldSpecs(m *ebpf.Map, ids []uint32) (*SpecIDs, error) {
	if m == nil {
		return nil, fmt.Errorf("usdt: nil spec map: %w", ErrBadSpecMap)
	}
	if err := checkSpecMap(m.Type(), m.KeySize(), m.ValueSize()); err != nil {
		return nil, err
	}
	s := &SpecIDs{ids: slices.Clone(ids)}
	seen := map[uint32]bool{}
	for _, id := range ids {
		if seen[id] {
			continue
		}
		seen[id] = true
		var raw [SpecSize]byte
		if err := m.Lookup(id, raw[:]); err != nil {
			return nil, fmt.Errorf("usdt: reading spec %d of %s: %w", id, SpecMapName, err)
		}
		if binary.NativeEndian.Uint32(raw[SpecSize-4:]) == 0 {
			return nil, fmt.Errorf("usdt: spec %d of %s is held by nobody, so it is not the one taken back: %w", id, SpecMapName, ErrBadSpecMap)
		}
		s.distinct = append(s.distinct, id)
	}
	if err := s.hold(m); err != nil {
		return nil, err
	}
	return s, nil
}

// Pin pins the spec map s holds ids in at path, on a BPF filesystem, for
// HeldSpecs to take back from.
func (s *SpecIDs) Pin(path string) error {
	if s == nil || s.m == nil {
		return fmt.Errorf("usdt: pin of released spec ids: %w", os.ErrClosed)
	}
	c, err := s.m.Clone() // a clone has no pin of its own to move
	if err != nil {
		return fmt.Errorf("usdt: %s: %w", SpecMapName, err)
	}
	defer c.Close()
	if err := c.Pin(path); err != nil {
		return fmt.Errorf("usdt: pinning %s: %w", SpecMapName, err)
	}
	return nil
}
