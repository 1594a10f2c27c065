package usdt

import (
	"errors"
	"reflect"
	"sync"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

const testObject = "testdata/usdt_test_x86_bpfel.o"

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
		{"mp_usdt_spec", reflect.TypeFor[Spec](), []string{"args", "arg_cnt", "reserved"}},
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
	for name, want := range map[string]*ebpf.MapSpec{SpecMapName: SpecMapSpec(DefaultMaxSpecs), IPMapName: IPMapSpec(DefaultMaxIPs)} {
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

func TestSpecTable(t *testing.T) {
	stored := map[uint32]Spec{}
	var mu sync.Mutex
	tab := NewSpecTable(4, func(id uint32, s *Spec) error {
		mu.Lock()
		defer mu.Unlock()
		stored[id] = *s
		return nil
	})
	spec := func(v int64) Spec {
		s, _ := NewSpec([]Arg{{Size: 8, Kind: ArgConst, Value: v, RegOffset: -1, IndexOffset: -1}})
		return s
	}
	a1, _ := tab.Acquire(spec(1))
	a2, _ := tab.Acquire(spec(1))
	b, _ := tab.Acquire(spec(2))
	c, _ := tab.Acquire(spec(3))
	if a1 != 1 || a2 != 1 || b != 2 || c != 3 {
		t.Fatalf("ids %d %d %d %d, want 1 1 2 3 (0 is reserved)", a1, a2, b, c)
	}
	if stored[2] != spec(2) || len(stored) != 3 {
		t.Fatalf("stored %v", stored)
	}
	if _, err := tab.Acquire(spec(4)); !errors.Is(err, ErrTooManySpecs) {
		t.Fatalf("fourth spec in a table of 4: %v", err)
	}
	if tab.Release(a1) || !tab.Release(a2) || tab.Release(a2) {
		t.Fatal("Release did not count references")
	}
	d, err := tab.Acquire(spec(4))
	if err != nil || d != 1 || stored[1] != spec(4) {
		t.Fatalf("freed id not reused: %d, %v", d, err)
	}
	if tab.Len() != 3 {
		t.Fatalf("Len %d", tab.Len())
	}
	failing := NewSpecTable(4, func(uint32, *Spec) error { return errors.New("boom") })
	if _, err := failing.Acquire(spec(1)); err == nil || failing.Len() != 0 {
		t.Fatalf("store error: %v, Len %d", err, failing.Len())
	}
}

// TestSpecTableConcurrent is for -race.
func TestSpecTableConcurrent(t *testing.T) {
	tab := NewSpecTable(64, nil)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 100 {
				s, _ := NewSpec([]Arg{{Size: 8, Kind: ArgConst, Value: int64(i % 10), RegOffset: -1, IndexOffset: -1}})
				id, err := tab.Acquire(s)
				if err != nil {
					t.Error(err)
					return
				}
				if (i+g)%2 == 0 {
					tab.Release(id)
				}
			}
		})
	}
	wg.Wait()
	if n := tab.Len(); n > 10 {
		t.Fatalf("%d ids for 10 distinct specs", n)
	}
}

func TestConfigureCollection(t *testing.T) {
	cs, err := ebpf.LoadCollectionSpec(testObject)
	if err != nil {
		t.Fatal(err)
	}
	if err := ConfigureCollection(cs, CollectionOptions{MaxSpecs: 1000, MaxIPs: 50, NoCookie: true}); err != nil {
		t.Fatal(err)
	}
	var noCookie bool
	var ipOff int32
	if err := cs.Variables[NoCookieVariable].Get(&noCookie); err != nil || !noCookie {
		t.Fatalf("%s = %v, %v", NoCookieVariable, noCookie, err)
	}
	if err := cs.Variables[ipOffsetVariable].Get(&ipOff); err != nil || HostArch() == ArchX86_64 && ipOff != 128 {
		t.Fatalf("%s = %d, %v", ipOffsetVariable, ipOff, err)
	}
	if cs.Maps[SpecMapName].MaxEntries != 1000 || cs.Maps[IPMapName].MaxEntries != 50 {
		t.Fatal("map sizes not applied")
	}
	cs.Maps[SpecMapName].ValueSize = 208
	if err := ConfigureCollection(cs, CollectionOptions{}); err == nil {
		t.Fatal("wrong value size accepted")
	}
	delete(cs.Maps, SpecMapName)
	if err := ConfigureCollection(cs, CollectionOptions{}); err == nil {
		t.Fatal("missing map accepted")
	}
}
