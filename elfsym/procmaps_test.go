package elfsym

import (
	"bytes"
	"testing"
)

func TestParseProcMaps(t *testing.T) {
	data := []byte(`5581c0a00000-5581c0a01000 r--p 00000000 fd:01 1835331                    /tmp/x/sema pie
5581c0a01000-5581c0a02000 r-xp 00001000 fd:01 1835331                    /tmp/x/sema pie
7ffd2d5a3000-7ffd2d5c4000 rw-p 00000000 00:00 0                          [stack]
garbage line
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
`)
	ms := parseMaps(data)
	if len(ms) != 4 {
		t.Fatalf("%d mappings, want 4: %+v", len(ms), ms)
	}
	m := ms[1]
	want := mapsLine{Start: 0x5581c0a01000, End: 0x5581c0a02000, PgOff: 0x1000, Exec: true, Major: 0xfd, Minor: 1, Inode: 1835331, Path: "/tmp/x/sema pie"}
	if m != want {
		t.Errorf("mapping %+v, want %+v", m, want)
	}
}

func FuzzParseMapsLine(f *testing.F) {
	f.Add([]byte("5581c0a01000-5581c0a02000 r-xp 00001000 fd:01 1835331 /usr/bin/x"))
	f.Add([]byte("7ffd2d5a3000-7ffd2d5c4000 rw-p 00000000 00:00 0 [stack]"))
	f.Add([]byte("0-1 r 0 0:0 0"))
	f.Fuzz(func(t *testing.T, line []byte) {
		m, ok := parseMapsLine(line)
		if !ok {
			return
		}
		if m.End < m.Start {
			t.Fatalf("end %#x before start %#x", m.End, m.Start)
		}
		if m.Path != "" && !bytes.Contains(line, []byte(m.Path)) {
			t.Fatalf("path %q not in line %q", m.Path, line)
		}
	})
}
