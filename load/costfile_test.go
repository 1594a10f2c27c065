package load

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/multiprobe/multiprobe/probetest"
	"golang.org/x/sys/unix"
)

// otherUID is a real uid that is neither root nor the test's (nobody).
const otherUID = 65534

// TestCostCacheTraps plants, as another user would, each path the cache must
// not follow, read without bound, block on or replace, and checks that both
// opening and saving refuse it with an error that names what was found, and
// that nothing was written anywhere.
func TestCostCacheTraps(t *testing.T) {
	probetest.RequireRoot(t)
	tests := []struct {
		name string
		// plant prepares root and returns the cache path and a check that
		// nothing changed outside the cache.
		plant   func(t *testing.T, root string) (path string, unchanged func(t *testing.T))
		wantErr string
	}{
		{
			name: "symlink to /dev/zero",
			plant: func(t *testing.T, root string) (string, func(*testing.T)) {
				p := filepath.Join(root, "costs.json")
				must(t, os.Symlink("/dev/zero", p))
				return p, func(t *testing.T) {
					isLink(t, p, "/dev/zero")
					isCharDevice(t, "/dev/zero")
				}
			},
			wantErr: "is a symbolic link",
		},
		{
			name: "FIFO",
			plant: func(t *testing.T, root string) (string, func(*testing.T)) {
				p := filepath.Join(root, "costs.json")
				must(t, unix.Mkfifo(p, 0o644))
				return p, func(t *testing.T) { hasType(t, p, unix.S_IFIFO) }
			},
			wantErr: "is a FIFO",
		},
		{
			name: "character device",
			plant: func(t *testing.T, root string) (string, func(*testing.T)) {
				// A copy of /dev/null's node, never the real one.
				p := filepath.Join(root, "costs.json")
				must(t, unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
				return p, func(t *testing.T) { isCharDevice(t, p) }
			},
			wantErr: "is a character device",
		},
		{
			name: "too large",
			plant: func(t *testing.T, root string) (string, func(*testing.T)) {
				p := filepath.Join(root, "costs.json")
				must(t, os.WriteFile(p, nil, 0o644))
				must(t, os.Truncate(p, maxCostCacheSize+1))
				return p, func(*testing.T) {}
			},
			wantErr: "more than the",
		},
		{
			name: "group-writable directory",
			plant: func(t *testing.T, root string) (string, func(*testing.T)) {
				dir := filepath.Join(root, "shared")
				must(t, os.Mkdir(dir, 0o755))
				must(t, os.Chmod(dir, 0o775))
				return filepath.Join(dir, "costs.json"), func(t *testing.T) { isEmpty(t, dir) }
			},
			wantErr: "writable by group or others",
		},
		{
			name: "directory of another user",
			plant: func(t *testing.T, root string) (string, func(*testing.T)) {
				dir := filepath.Join(root, "theirs")
				must(t, os.Mkdir(dir, 0o755))
				must(t, os.Chown(dir, otherUID, otherUID))
				return filepath.Join(dir, "costs.json"), func(t *testing.T) { isEmpty(t, dir) }
			},
			wantErr: "owned by uid 65534",
		},
		{
			name: "symlinked directory planted by another user",
			plant: func(t *testing.T, root string) (string, func(*testing.T)) {
				// The target is root's and private: only the link is foreign.
				target := filepath.Join(root, "target")
				must(t, os.Mkdir(target, 0o700))
				link := filepath.Join(root, "cache")
				must(t, os.Symlink(target, link))
				must(t, os.Lchown(link, otherUID, otherUID))
				return filepath.Join(link, "costs.json"), func(t *testing.T) { isEmpty(t, target) }
			},
			wantErr: "is a symlink owned by uid 65534",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			path, unchanged := tt.plant(t, root)

			// A FIFO must not hang: give every open a deadline.
			done := make(chan error, 1)
			go func() {
				_, err := OpenCostCache(path)
				done <- err
			}()
			select {
			case err := <-done:
				checkUnsafe(t, "OpenCostCache", err, tt.wantErr)
			case <-time.After(5 * time.Second):
				t.Fatal("OpenCostCache blocked for 5s")
			}

			c := NewCostCache(path)
			c.Record(skewedProgram("p", 10, 10, 1), Cost{Verify: time.Millisecond})
			err := c.Save()
			if tt.name == "too large" {
				// Replacing an oversized regular file is safe.
				if err != nil {
					t.Fatalf("Save over an oversized cache: %v", err)
				}
				return
			}
			checkUnsafe(t, "Save", err, tt.wantErr)
			unchanged(t)
		})
	}
}

// TestCostCacheTrustedSymlinkDir checks that a directory symlink of the
// user's own is followed: the check is about who planted it.
func TestCostCacheTrustedSymlinkDir(t *testing.T) {
	root := t.TempDir()
	target := filepath.Join(root, "target")
	must(t, os.Mkdir(target, 0o700))
	link := filepath.Join(root, "cache")
	must(t, os.Symlink(target, link))
	c := NewCostCache(filepath.Join(link, "costs.json"))
	c.Record(skewedProgram("p", 10, 10, 1), Cost{Verify: time.Millisecond})
	must(t, c.Save())
	d, err := OpenCostCache(filepath.Join(link, "costs.json"))
	must(t, err)
	if d.Len() != 1 {
		t.Fatalf("reopened cache holds %d entries, want 1", d.Len())
	}
	ents, _ := os.ReadDir(target)
	if len(ents) != 1 || ents[0].Name() != "costs.json" {
		t.Fatalf("target holds %v, want costs.json only", ents)
	}
}

func checkUnsafe(t *testing.T, what string, err error, want string) {
	t.Helper()
	if !errors.Is(err, ErrUnsafeCostCache) {
		t.Fatalf("%s: err = %v, want ErrUnsafeCostCache", what, err)
	}
	if !strings.Contains(err.Error(), want) {
		t.Errorf("%s: %q does not say %q", what, err, want)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func hasType(t *testing.T, path string, typ uint32) {
	t.Helper()
	var st unix.Stat_t
	must(t, unix.Lstat(path, &st))
	if uint32(st.Mode)&unix.S_IFMT != typ {
		t.Errorf("%s is now a %s", path, fileType(uint32(st.Mode)))
	}
}

func isCharDevice(t *testing.T, path string) { t.Helper(); hasType(t, path, unix.S_IFCHR) }

func isLink(t *testing.T, path, target string) {
	t.Helper()
	hasType(t, path, unix.S_IFLNK)
	if got, _ := os.Readlink(path); got != target {
		t.Errorf("%s now points to %q", path, got)
	}
}

func isEmpty(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	must(t, err)
	if len(ents) != 0 {
		t.Errorf("%s holds %d files, want none", dir, len(ents))
	}
}
