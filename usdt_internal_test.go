package multiprobe

import (
	"testing"

	"github.com/cilium/ebpf"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/usdt"
)

// TestSpecTableByMapID checks that two handles to one spec map share one id
// space, and that the table writes through its own handle, which outlives
// the one it was made from.
func TestSpecTableByMapID(t *testing.T) {
	testutil.RequireBPF(t)
	m, err := ebpf.NewMap(usdt.SpecMapSpec(8))
	if err != nil {
		t.Fatal(err)
	}
	other, err := m.Clone()
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()

	a, err := acquireSpecTable(m)
	if err != nil {
		t.Fatal(err)
	}
	b, err := acquireSpecTable(other)
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Fatal("two handles to one map got two spec tables")
	}
	m.Close() // the table's writes must not depend on this handle
	id, err := b.Acquire(usdt.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	var got [usdt.SpecSize]byte
	if err := other.Lookup(id, &got); err != nil {
		t.Fatalf("spec %d not in the map: %v", id, err)
	}
	b.Release(id)
	releaseSpecTable(a)
	releaseSpecTable(b)
	specTables.Lock()
	n := len(specTables.m)
	specTables.Unlock()
	if n != 0 {
		t.Errorf("%d spec tables left after the last release", n)
	}
}
