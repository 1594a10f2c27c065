package multiprobe

import (
	"errors"
	"reflect"
	"testing"

	"github.com/multiprobe/multiprobe/elfsym"
	"github.com/multiprobe/multiprobe/usdt"
)

func testManifest() *manifest {
	return &manifest{
		Version:  pinVersion,
		Programs: []pinnedProg{{Pin: "prog"}},
		Files:    []fileID{{Path: "/usr/lib/libc.so.6", Dev: 0x803, Ino: 42, Size: 1 << 21, MtimeNs: 1e18, BuildID: "abcd"}},
		Units: []pinnedUnit{{Dir: "unit0", Kind: Entry, Targets: []pinnedTarget{{File: 0, Offsets: []uint64{0x100, 0x200}, Cookies: []uint64{0, 1}}}},
			{Dir: "unit1", Kind: Return, Targets: []pinnedTarget{{File: 0, Offsets: []uint64{0x300}, Cookies: []uint64{2}, RefCtrOffsets: []uint64{0}}}}},
		Probes: []Probe{{Kind: Entry, Target: "libc", Patterns: []string{"mem*"}}, {Kind: USDT, Target: "libc", Patterns: []string{"libc:*"}}},
		Paths:  []string{"/usr/lib/libc.so.6"},
		Sites: []pinnedSite{
			{Name: "memcpy", Names: []string{"memcpy", "memmove"}, Offset: 0x100, Moved: uint8(elfsym.MovedIFunc),
				Symbol: &pinnedSymbol{Size: 1952, Address: 0x100100, Moved: uint8(elfsym.MovedIFunc), Name: "__memmove_avx_unaligned_erms"}},
			{Name: "libc:setjmp", Offset: 0x200, Probe: 1, Cookie: 1, USDT: &usdt.Site{Offset: 0x200, ArgString: "8@%rdi",
				Args: []usdt.Arg{{Spec: "8@%rdi", Size: 8, Kind: usdt.ArgReg, Reg: "rdi", RegOffset: 112, IndexOffset: -1}}}},
		},
	}
}

// TestManifestRoundTrip: what encodeManifest writes, decodeManifest reads
// back, sites and all.
func TestManifestRoundTrip(t *testing.T) {
	m := testManifest()
	data, err := encodeManifest(m)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeManifest(append(data, make([]byte, 100)...)) // a map's padding
	if err != nil {
		t.Fatal(err)
	}
	if err := m.check(); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.Units, m.Units) || !reflect.DeepEqual(got.Files, m.Files) || !reflect.DeepEqual(got.Sites, m.Sites) {
		t.Errorf("decoded %+v\nwant %+v", got, m)
	}
	if s := got.sites[0]; s.Probe.Target != "libc" || s.Label() != "memcpy/memmove" || s.Path != "/usr/lib/libc.so.6" ||
		s.Symbol.Moved != elfsym.MovedIFunc || s.Symbol.Offset != 0x100 || s.Symbol.Name != "__memmove_avx_unaligned_erms" || s.Symbol.Size != 1952 {
		t.Errorf("site 0 = %+v", s)
	}
	if s := got.sites[1]; s.ProbeKind() != "usdt" || s.USDT.ArgString != "8@%rdi" {
		t.Errorf("site 1 = %+v", s)
	}

	m.Version = pinVersion + 1
	data, _ = encodeManifest(m)
	if _, err := decodeManifest(data); !errors.Is(err, ErrPinVersion) {
		t.Errorf("another version: %v, want ErrPinVersion", err)
	}
	m = testManifest()
	m.Units[0].Targets[0].File = 7
	data, _ = encodeManifest(m)
	if _, err := decodeManifest(data); !errors.Is(err, ErrNotPinned) {
		t.Errorf("a target's file out of range: %v, want ErrNotPinned", err)
	}
}

// FuzzDecodeManifest: a manifest map is bytes anyone who can write the
// BPF filesystem could have put there; decoding them must not panic.
func FuzzDecodeManifest(f *testing.F) {
	data, err := encodeManifest(testManifest())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	f.Add(data[:20])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := decodeManifest(data)
		if err != nil {
			return
		}
		for _, s := range m.sites {
			_ = s.String()
		}
		for _, u := range m.Units {
			_ = m.targets(u)
		}
	})
}
