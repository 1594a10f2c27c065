package elfsym

import (
	"errors"
	"os"
	"runtime"
	"testing"
)

// FuzzOpen opens arbitrary bytes as an ELF file and resolves patterns in it:
// nothing may panic, and every failure must be one of the package's
// sentinel errors.
func FuzzOpen(f *testing.F) {
	for _, p := range []string{"testdata/tiny.elf", "testdata/tiny.c"} {
		if data, err := os.ReadFile(p); err == nil {
			f.Add(data)
		}
	}
	f.Add([]byte("\x7fELF\x02\x01\x01"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		defer func() {
			// Allocation must follow the file's size, not what a hostile
			// header claims: a 1 KiB file must not make us allocate 1 GiB.
			runtime.ReadMemStats(&after)
			if got, limit := after.TotalAlloc-before.TotalAlloc, uint64(4<<20+64*len(data)); got > limit {
				t.Fatalf("allocated %d bytes for a %d-byte file (limit %d)", got, len(data), limit)
			}
		}()
		file, err := NewFile("fuzz", data)
		if err != nil {
			if !errors.Is(err, ErrNotELF) && !errors.Is(err, ErrUnsupported) && !errors.Is(err, ErrMalformed) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		defer file.Close()
		for _, pats := range [][]string{{"*"}, {"main"}, {"f*", "!*x"}, {"*@*"}} {
			sites, err := file.Resolve(pats...)
			if err != nil {
				if !errors.Is(err, ErrNoMatch) && !errors.Is(err, ErrAmbiguous) {
					t.Fatalf("Resolve(%q): unexpected error kind: %v", pats, err)
				}
				continue
			}
			for _, s := range sites {
				if s.Offset >= uint64(len(data)) {
					t.Fatalf("site %+v: offset past the end of a %d-byte file", s, len(data))
				}
			}
		}
	})
}
