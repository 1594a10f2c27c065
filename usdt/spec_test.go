package usdt

import (
	"errors"
	"reflect"
	"runtime"
	"slices"
	"sync"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/multiprobe/multiprobe/probetest"
)

// testObject is the test BPF object built for this machine: mp_usdt.bpf.h
// reads pt_regs, whose layout is the architecture's.
var testObject = map[string]string{
	"amd64": "testdata/usdt_test_x86_bpfel.o",
	"arm64": "testdata/usdt_test_arm64_bpfel.o",
}[runtime.GOARCH]

// TestSpecLayout checks the Go mirror of the spec structs against the BTF
// of an object compiled from bpf/usdt.bpf.h: same size, and every member
// at the same offset with the same size.
func TestSpecLayout(t *testing.T) {
	spec, err := btf.LoadSpec(testObject)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		cName string
		goTyp reflect.Type
		names []string // C member names in order
	}{
		{"mp_usdt_arg", reflect.TypeFor[SpecArg](), []string{"val", "reg_off", "idx_off", "kind", "size", "is_signed", "scale_shift"}},
		{"mp_usdt_spec", reflect.TypeFor[Spec](), []string{"args", "arg_cnt", "refs"}},
	} {
		var st *btf.Struct
		if err := spec.TypeByName(c.cName, &st); err != nil {
			t.Fatalf("struct %s: %v", c.cName, err)
		}
		if uintptr(st.Size) != c.goTyp.Size() {
			t.Errorf("struct %s is %d bytes, %s %d", c.cName, st.Size, c.goTyp, c.goTyp.Size())
		}
		if len(st.Members) != c.goTyp.NumField() || len(st.Members) != len(c.names) {
			t.Fatalf("struct %s has %d members, %s %d fields", c.cName, len(st.Members), c.goTyp, c.goTyp.NumField())
		}
		for i, m := range st.Members {
			f := c.goTyp.Field(i)
			size, err := btf.Sizeof(m.Type)
			if err != nil {
				t.Fatal(err)
			}
			if m.Name != c.names[i] || uintptr(m.Offset.Bytes()) != f.Offset || uintptr(size) != f.Type.Size() {
				t.Errorf("%s.%s at %d (%d bytes), Go %s at %d (%d bytes)",
					c.cName, m.Name, m.Offset.Bytes(), size, f.Name, f.Offset, f.Type.Size())
			}
		}
	}
	if reflect.TypeFor[Spec]().Size() != SpecSize {
		t.Errorf("SpecSize %d, Go struct %d", SpecSize, reflect.TypeFor[Spec]().Size())
	}
	// The map declared by the header is what SpecMapSpec describes.
	cs, err := ebpf.LoadCollectionSpec(testObject)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]*ebpf.MapSpec{SpecMapName: SpecMapSpec(DefaultMaxSpecs)} {
		m := cs.Maps[name]
		if m == nil || m.Type != want.Type || m.KeySize != want.KeySize || m.ValueSize != want.ValueSize || m.MaxEntries != want.MaxEntries {
			t.Errorf("map %s in the object: %v, want %v", name, m, want)
		}
	}
}

func TestSpecEncoding(t *testing.T) {
	args, err := ParseArgs(ArchX86_64, "-4@-8(%rbp) 8@$-3 1@%al 4@16(%rax,%rbx,8) 2@(,%rcx,2)")
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewSpec(args)
	if err != nil {
		t.Fatal(err)
	}
	want := []SpecArg{
		{Value: -8, RegOffset: 32, IndexOffset: -1, Kind: ArgMem, Size: 4, Signed: 1},
		{Value: -3, RegOffset: -1, IndexOffset: -1, Kind: ArgConst, Size: 8},
		{RegOffset: 80, IndexOffset: -1, Kind: ArgReg, Size: 1},
		{Value: 16, RegOffset: 80, IndexOffset: 40, Kind: ArgSIB, Size: 4, ScaleShift: 3},
		{RegOffset: -1, IndexOffset: 88, Kind: ArgSIB, Size: 2, ScaleShift: 1},
	}
	if s.ArgCount != 5 {
		t.Fatalf("ArgCount %d", s.ArgCount)
	}
	for i, w := range want {
		if s.Args[i] != w {
			t.Errorf("arg %d: %+v, want %+v", i, s.Args[i], w)
		}
	}
	b, err := s.MarshalBinary()
	if err != nil || len(b) != SpecSize {
		t.Fatalf("MarshalBinary: %d bytes, %v", len(b), err)
	}
	var back Spec
	if err := back.UnmarshalBinary(b); err != nil || back != s {
		t.Fatalf("round trip: %+v, %v", back, err)
	}
	if err := back.UnmarshalBinary(b[1:]); err == nil {
		t.Fatal("UnmarshalBinary of a short buffer succeeded")
	}
	if _, err := NewSpec(make([]Arg, MaxArgs+1)); !errors.Is(err, ErrBadArgSpec) {
		t.Fatalf("13 args: %v", err)
	}
	if _, err := NewSpec([]Arg{{Size: 3, Kind: ArgConst}}); !errors.Is(err, ErrBadArgSpec) {
		t.Fatalf("size 3: %v", err)
	}
}

func TestCookie(t *testing.T) {
	for _, c := range []struct{ id, user uint32 }{{0, 0}, {1, 2}, {0xffffffff, 0xffffffff}, {7, 0x80000000}} {
		ck := PackCookie(c.id, c.user)
		if id, user := UnpackCookie(ck); id != c.id || user != c.user || ck>>32 != uint64(c.id) {
			t.Errorf("PackCookie(%d, %d) = %#x unpacks to %d, %d", c.id, c.user, ck, id, user)
		}
	}
}

// TestAcquireSpecs hands out ids to two holders of one spec map, as two
// links of one program are, and checks the map after every step.
func TestAcquireSpecs(t *testing.T) {
	probetest.RequireBPF(t)
	m, err := ebpf.NewMap(SpecMapSpec(4))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	spec := func(v int64) Spec {
		s, _ := NewSpec([]Arg{{Size: 8, Kind: ArgConst, Value: v, RegOffset: -1, IndexOffset: -1}})
		return s
	}
	a, err := AcquireSpecs(m, []Spec{spec(1), spec(1), spec(2)})
	if err != nil {
		t.Fatal(err)
	}
	b, err := AcquireSpecs(m, []Spec{spec(2), spec(3)})
	if err != nil {
		t.Fatal(err)
	}
	if got := append(slices.Clone(a.IDs()), b.IDs()...); !slices.Equal(got, []uint32{1, 1, 2, 2, 3}) {
		t.Fatalf("ids %v, want [1 1 2] and [2 3] (0 is reserved, equal specs share)", got)
	}
	table, refs, err := readSpecs(m)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(refs, []uint32{0, 1, 2, 1}) || table[3] != spec(3) {
		t.Fatalf("map refs %v, spec 3 %v", refs, table[3])
	}
	if _, err := AcquireSpecs(m, []Spec{spec(4)}); !errors.Is(err, ErrTooManySpecs) {
		t.Fatalf("fourth spec in a map of 4: %v", err)
	}
	if _, err := AcquireSpecs(m, []Spec{spec(2), spec(4)}); !errors.Is(err, ErrTooManySpecs) {
		t.Fatalf("fourth spec beside a held one: %v", err)
	}
	if _, refs, _ := readSpecs(m); !slices.Equal(refs, []uint32{0, 1, 2, 1}) {
		t.Fatalf("failed AcquireSpecs changed refs to %v", refs)
	}
	if err := a.Release(); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(); err != nil {
		t.Fatalf("second Release: %v", err)
	}
	table, refs, _ = readSpecs(m)
	if !slices.Equal(refs, []uint32{0, 0, 1, 1}) || table[1] != (Spec{}) {
		t.Fatalf("after Release: refs %v, spec 1 %v (want cleared)", refs, table[1])
	}
	c, err := AcquireSpecs(m, []Spec{spec(4)})
	if err != nil || !slices.Equal(c.IDs(), []uint32{1}) {
		t.Fatalf("freed id not reused: %v, %v", c.IDs(), err)
	}
	c.Release()
	b.Release()
	if _, refs, _ := readSpecs(m); !slices.Equal(refs, []uint32{0, 0, 0, 0}) {
		t.Fatalf("after every Release: refs %v", refs)
	}
	arr, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer arr.Close()
	if _, err := AcquireSpecs(arr, nil); !errors.Is(err, ErrBadSpecMap) {
		t.Errorf("AcquireSpecs on another layout: %v, want ErrBadSpecMap", err)
	}
}

// TestAcquireSpecsConcurrent is for -race: holders with their own handles
// of one map must agree on ids.
func TestAcquireSpecsConcurrent(t *testing.T) {
	probetest.RequireBPF(t)
	m, err := ebpf.NewMap(SpecMapSpec(64))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			h, err := m.Clone()
			if err != nil {
				t.Error(err)
				return
			}
			defer h.Close()
			for i := range 50 {
				s, _ := NewSpec([]Arg{{Size: 8, Kind: ArgConst, Value: int64(i % 10), RegOffset: -1, IndexOffset: -1}})
				ids, err := AcquireSpecs(h, []Spec{s})
				if err != nil {
					t.Error(err)
					return
				}
				if (i+g)%2 == 0 {
					ids.Release()
				}
			}
		})
	}
	wg.Wait()
	table, refs, err := readSpecs(m)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[Spec]bool{}
	for id, r := range refs {
		if r > 0 {
			if seen[table[id]] {
				t.Fatalf("spec %v under two ids", table[id])
			}
			seen[table[id]] = true
		}
	}
	if len(seen) > 10 {
		t.Fatalf("%d ids for 10 distinct specs", len(seen))
	}
}

func TestConfigureCollection(t *testing.T) {
	cs, err := ebpf.LoadCollectionSpec(testObject)
	if err != nil {
		t.Fatal(err)
	}
	if err := ConfigureCollection(cs, CollectionOptions{MaxSpecs: 1000}); err != nil {
		t.Fatal(err)
	}
	if cs.Maps[SpecMapName].MaxEntries != 1000 {
		t.Fatal("map size not applied")
	}
	cs.Maps[SpecMapName].ValueSize = 208
	if err := ConfigureCollection(cs, CollectionOptions{}); !errors.Is(err, ErrBadSpecMap) {
		t.Fatalf("wrong value size: %v, want ErrBadSpecMap", err)
	}
	delete(cs.Maps, SpecMapName)
	if err := ConfigureCollection(cs, CollectionOptions{}); !errors.Is(err, ErrBadSpecMap) {
		t.Fatalf("missing map: %v, want ErrBadSpecMap", err)
	}
}

// TestHeldSpecs: a holder that Closes keeps its references, as a pinned
// link's sites need; HeldSpecs takes them back, and Release then frees
// them. An id nobody holds is not taken back.
func TestHeldSpecs(t *testing.T) {
	probetest.RequireBPF(t)
	m, err := ebpf.NewMap(SpecMapSpec(4))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	spec := func(v int64) Spec {
		s, _ := NewSpec([]Arg{{Size: 8, Kind: ArgConst, Value: v, RegOffset: -1, IndexOffset: -1}})
		return s
	}
	a, err := AcquireSpecs(m, []Spec{spec(1), spec(1), spec(2)})
	if err != nil {
		t.Fatal(err)
	}
	ids := slices.Clone(a.IDs())
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(); err != nil {
		t.Fatalf("Release after Close: %v", err)
	}
	if _, refs, _ := readSpecs(m); !slices.Equal(refs, []uint32{0, 1, 1, 0}) {
		t.Fatalf("after Close: refs %v, want them kept", refs)
	}
	back, err := HeldSpecs(m, ids)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(back.IDs(), ids) {
		t.Errorf("taken back ids %v, want %v", back.IDs(), ids)
	}
	if err := back.Release(); err != nil {
		t.Fatal(err)
	}
	if table, refs, _ := readSpecs(m); !slices.Equal(refs, []uint32{0, 0, 0, 0}) || table[1] != (Spec{}) {
		t.Fatalf("after Release: refs %v, spec 1 %v", refs, table[1])
	}
	if _, err := HeldSpecs(m, []uint32{1}); !errors.Is(err, ErrBadSpecMap) {
		t.Errorf("HeldSpecs of an id nobody holds: %v, want ErrBadSpecMap", err)
	}
	if _, err := HeldSpecs(m, []uint32{9}); err == nil {
		t.Error("HeldSpecs of an id past the map: no error")
	}
}
