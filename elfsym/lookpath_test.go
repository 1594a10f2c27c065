package elfsym

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestLookPathNames checks the bare names a user types, as bpftrace takes
// them: a file in the current directory, a library without its soname
// version, and that a miss says in one line where it looked.
func TestLookPathNames(t *testing.T) {
	libc, err := LookPath("libc.so.6")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	data, err := os.ReadFile("/bin/true")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "u.bin"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sh"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)

	for _, tt := range []struct {
		name, want string
		suffix     bool // want is a suffix of the path
	}{
		{"u.bin", filepath.Join(dir, "u.bin"), false},
		{"./u.bin", "./u.bin", false},
		{"libc", libc, false},
		{"libc.so.6", libc, false},
		{"sh", "/sh", true}, // a directory here is not the target: $PATH's sh is
	} {
		got, err := LookPath(tt.name)
		if err != nil || (!tt.suffix && got != tt.want) || (tt.suffix && (!strings.HasSuffix(got, tt.want) || got == filepath.Join(dir, "sh"))) {
			t.Errorf("LookPath(%q) = %q, %v; want %q", tt.name, got, err, tt.want)
		}
	}
	for _, name := range []string{"libnosuchlib", "nosuchprogram", "libc.so.99"} {
		_, err := LookPath(name)
		if !errors.Is(err, ErrNotFound) || !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("LookPath(%q) = %v, want ErrNotFound and fs.ErrNotExist", name, err)
			continue
		}
		msg := err.Error()
		if strings.Contains(msg, "\n") || !strings.Contains(msg, "current directory") || !strings.Contains(msg, "./"+name) {
			t.Errorf("LookPath(%q) error %q: want one line that says where it looked and what to type", name, msg)
		}
	}
	// Inside a root neither the current directory nor $PATH is the
	// container's.
	self := "/proc/" + itoa(os.Getpid()) + "/root"
	if p, err := LookPathIn(self, "u.bin"); err == nil {
		t.Errorf("LookPathIn(%s, u.bin) = %s, want not found", self, p)
	}
	if p, err := LookPathIn(self, "libc"); err != nil || p != self+libc {
		t.Errorf("LookPathIn(%s, libc) = %s, %v; want %s", self, p, err, self+libc)
	}
}

// TestGlobIn: a glob in a target path names each file once, by its own
// name, and says what is wrong with a pattern that names nothing.
func TestGlobIn(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"libx.so.1", "liby.so.2"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("libx.so.1", filepath.Join(dir, "libx.so")); err != nil {
		t.Fatal(err)
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	got, err := GlobIn("", filepath.Join(dir, "lib*.so*"))
	if want := []string{filepath.Join(real, "libx.so.1"), filepath.Join(real, "liby.so.2")}; err != nil || !slices.Equal(got, want) {
		t.Errorf("GlobIn = %q, %v; want %q", got, err, want)
	}
	if _, err := GlobIn("", "lib*.so"); !errors.Is(err, ErrBadPattern) {
		t.Errorf("a relative pattern: %v, want ErrBadPattern", err)
	}
	if _, err := GlobIn("", filepath.Join(dir, "nope*")); !errors.Is(err, ErrNotFound) {
		t.Errorf("no match: %v, want ErrNotFound", err)
	}
}
