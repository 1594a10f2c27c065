package fds

import (
	"errors"
	"io/fs"

	"os"
	"testing"

	"golang.org/x/sys/unix"
)

func TestCount(t *testing.T) {
	before, err := Count()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	during, err := Count()
	f.Close()
	after, err2 := Count()
	if err != nil || err2 != nil {
		t.Fatal(err, err2)
	}
	if during != before+1 || after != before {
		t.Errorf("counts %d, %d with one more open, %d after closing it", before, during, after)
	}
}

func TestOpenRegular(t *testing.T) {
	dir := t.TempDir()
	fifo := dir + "/fifo"
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path string
		want error
	}{
		{"/proc/self/exe", nil},
		{fifo, ErrNotRegular}, // must not block
		{"/dev/null", ErrNotRegular},
		{dir, ErrNotRegular},
		{dir + "/missing", fs.ErrNotExist},
	} {
		f, err := OpenRegular(tc.path)
		if !errors.Is(err, tc.want) {
			t.Errorf("OpenRegular(%s): %v, want %v", tc.path, err, tc.want)
		}
		if f != nil {
			f.Close()
		}
	}
}

func TestSplitProcRoot(t *testing.T) {
	for _, tc := range []struct {
		path, root, rest string
		ok               bool
	}{
		{"/proc/123/root/usr/lib/libc.so.6", "/proc/123/root", "usr/lib/libc.so.6", true},
		{"/proc/123/root", "/proc/123/root", "", true},
		{"/proc/self/root/../../etc/passwd", "/proc/self/root", "../../etc/passwd", true},
		{"/proc/123/rootfs/x", "", "", false},
		{"/proc/12a/root/x", "", "", false},
		{"/proc//root/x", "", "", false},
		{"/usr/lib/libc.so.6", "", "", false},
		{"proc/123/root/x", "", "", false},
	} {
		root, rest, ok := SplitProcRoot(tc.path)
		if root != tc.root || rest != tc.rest || ok != tc.ok {
			t.Errorf("SplitProcRoot(%q) = %q, %q, %v; want %q, %q, %v", tc.path, root, rest, ok, tc.root, tc.rest, tc.ok)
		}
	}
}
