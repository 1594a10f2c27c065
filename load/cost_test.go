package load

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

func TestCostCacheRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "costs.json")
	c, err := OpenCostCache(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.Len() != 0 {
		t.Fatalf("new cache holds %d entries", c.Len())
	}
	a, b := skewedProgram("a", 10, 10, 1), skewedProgram("b", 20, 10, 1)
	ca := Cost{Verify: 3 * time.Millisecond, Verified: 1234, Instructions: len(a.Instructions)}
	c.Record(a, ca)
	if err := c.Save(); err != nil {
		t.Fatal(err)
	}

	d, err := OpenCostCache(path)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := d.Lookup(a); !ok || got != ca {
		t.Errorf("Lookup(a) = %+v, %v; want %+v", got, ok, ca)
	}
	if _, ok := d.Lookup(b); ok {
		t.Error("Lookup(b) hit; b was never recorded")
	}
	// The file holds no temporary leftovers.
	ents, _ := os.ReadDir(filepath.Dir(path))
	if len(ents) != 1 {
		t.Errorf("cache directory holds %d files, want 1", len(ents))
	}
}

func TestCostCacheKey(t *testing.T) {
	c := NewCostCache("")
	base := skewedProgram("p", 10, 10, 1)
	c.Record(base, Cost{Verify: time.Millisecond})
	tests := []struct {
		name   string
		change func(*ebpf.ProgramSpec)
		hit    bool
	}{
		{"same program", func(*ebpf.ProgramSpec) {}, true},
		{"renamed", func(p *ebpf.ProgramSpec) { p.Name = "q" }, true},
		{"map fd differs", func(p *ebpf.ProgramSpec) { p.Instructions[1].Constant = 42 }, true},
		{"one constant differs", func(p *ebpf.ProgramSpec) { p.Instructions[len(p.Instructions)-4] = asm.JLT.Imm(asm.R8, 11, "loop") }, false},
		{"attach type", func(p *ebpf.ProgramSpec) { p.AttachType = ebpf.AttachTraceUprobeMulti }, false},
		{"program type", func(p *ebpf.ProgramSpec) { p.Type = ebpf.Kprobe }, false},
		{"map renamed", func(p *ebpf.ProgramSpec) { p.Instructions[1] = p.Instructions[1].WithReference("other") }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := base.Copy()
			tt.change(p)
			if _, ok := c.Lookup(p); ok != tt.hit {
				t.Errorf("hit = %v, want %v", ok, tt.hit)
			}
		})
	}
	other := &CostCache{release: "0.0.0-other", entries: c.entries}
	if _, ok := other.Lookup(base); ok {
		t.Error("a cost recorded on one kernel hit on another")
	}
}

func TestCostCacheBadFile(t *testing.T) {
	for name, content := range map[string]string{
		"garbage":       "\x00not json",
		"other version": `{"version": 99, "programs": {}}`,
		"truncated":     `{"version": 1, "programs": {"ab`,
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "costs.json")
			if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
			c, err := OpenCostCache(path)
			if err != nil || c.Len() != 0 {
				t.Fatalf("OpenCostCache = %d entries, %v; want an empty cache", c.Len(), err)
			}
			c.Record(badProgram("x"), Cost{Verify: 1})
			if err := c.Save(); err != nil {
				t.Fatal(err)
			}
			if d, _ := OpenCostCache(path); d.Len() != 1 {
				t.Errorf("rewritten cache holds %d entries, want 1", d.Len())
			}
		})
	}
}

func TestCostCacheBounded(t *testing.T) {
	c := NewCostCache(filepath.Join(t.TempDir(), "costs.json"))
	for i := range maxCostEntries + 10 {
		c.Record(skewedProgram("p", i+1, 0, 0), Cost{Verify: time.Duration(i)})
	}
	if err := c.Save(); err != nil {
		t.Fatal(err)
	}
	if c.Len() != maxCostEntries {
		t.Errorf("cache holds %d entries, want %d", c.Len(), maxCostEntries)
	}
	// The newest survive.
	if _, ok := c.Lookup(skewedProgram("p", maxCostEntries+10, 0, 0)); !ok {
		t.Error("newest entry was dropped")
	}
}

func FuzzDecodeCosts(f *testing.F) {
	f.Add([]byte(`{"version":1,"programs":{"k":{"name":"p","verify_ns":5,"verified_insns":3,"insns":2,"updated":"2025-01-01T00:00:00Z"}}}`))
	f.Add([]byte(`{"version":1,"programs":{"k":{"verify_ns":-5}}}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		entries, err := decodeCosts(data)
		if err != nil {
			return
		}
		for k, e := range entries {
			if e.Verify < 0 || e.Instructions < 0 {
				t.Errorf("entry %q has negative cost %+v", k, e)
			}
		}
	})
}
