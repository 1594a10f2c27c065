package multiprobe

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

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

// TestManifestBounds: a manifest of 100,000 sites (offsets and cookies in
// sequence, the kind gzip shrinks most) decodes; a manifest whose head or
// sites inflate far past what its sites can need (64 MiB of JSON in
// 64 KiB) is refused at once, without inflating it. Before,
// LoadPinnedLink inflated up to 1 GiB (27.8 s and +1.2 GB there).
func TestManifestBounds(t *testing.T) {
	m := testManifest()
	const n = 100_000
	tg := &m.Units[0].Targets[0]
	tg.Offsets, tg.Cookies = nil, nil
	m.Sites = nil
	for i := range n {
		tg.Offsets = append(tg.Offsets, uint64(0x1000+16*i))
		tg.Cookies = append(tg.Cookies, uint64(i))
		m.Sites = append(m.Sites, pinnedSite{Name: fmt.Sprintf("func_%06d", i), Offset: uint64(0x1000 + 16*i), Cookie: uint64(i)})
	}
	data, err := encodeManifest(m)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := decodeManifest(data); err != nil {
		t.Fatalf("a manifest of %d sites (%d bytes): %v", n, len(data), err)
	}

	bomb := func(json string, pad int) []byte {
		var buf bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
		zw.Write([]byte(json))
		zw.Write(bytes.Repeat([]byte(" "), pad))
		zw.Close()
		return append(binary.NativeEndian.AppendUint64(nil, uint64(buf.Len())), buf.Bytes()...)
	}
	head, _ := encodeManifest(testManifest())
	headLen := 8 + int(binary.NativeEndian.Uint64(head))
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"head", bomb(`{"version":1}`, 64<<20)},
		{"sites", append(head[:headLen:headLen], bomb(`{}`, 64<<20)...)},
	} {
		start := time.Now()
		_, err := decodeManifest(tc.data)
		if !errors.Is(err, ErrNotPinned) {
			t.Errorf("%s inflating to 64 MiB (%d bytes): %v, want ErrNotPinned", tc.name, len(tc.data), err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("%s: refused after %v", tc.name, d)
		}
	}
}
