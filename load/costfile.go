package load

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// maxCostCacheSize bounds what OpenCostCache reads: maxCostEntries entries
// take about 1 MiB, so anything much larger is not a cache this package
// wrote, and reading it whole (a device, a huge file) could exhaust memory.
const maxCostCacheSize = 8 << 20

// costDir is the cache's directory, opened and checked: the file is read and
// written relative to this fd, so swapping the path after the check cannot
// redirect the write.
type costDir struct {
	fd   int
	path string
}

// openCostDir opens dir after checking that no one but the current user (or
// root) could have placed or changed what is in it: the directory must be
// owned by the current user or root and not writable by group or others,
// and if dir is a symlink, the link must be owned by the current user or
// root too. Each property is read from the opened fd or with Lstat, never
// assumed from the path.
func openCostDir(dir string) (*costDir, error) {
	uid := os.Geteuid()
	flags := unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC | unix.O_NOFOLLOW
	var lst unix.Stat_t
	if err := unix.Lstat(dir, &lst); err != nil {
		return nil, fmt.Errorf("cost cache directory %s: %w", dir, err)
	}
	if lst.Mode&unix.S_IFMT == unix.S_IFLNK {
		if !trustedOwner(lst.Uid, uid) {
			return nil, fmt.Errorf("cost cache directory %s is a symlink owned by uid %d, not by you (uid %d) or root: %w (remove it or pass another --cost-cache path)",
				dir, lst.Uid, uid, ErrUnsafeCostCache)
		}
		// A trusted link may be followed; what it leads to is checked
		// below on the opened fd.
		flags &^= unix.O_NOFOLLOW
	}
	fd, err := unix.Open(dir, flags, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			// Replaced by a symlink after the Lstat.
			return nil, fmt.Errorf("cost cache directory %s changed into a symlink while being opened: %w", dir, ErrUnsafeCostCache)
		}
		return nil, fmt.Errorf("open cost cache directory %s: %w", dir, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("cost cache directory %s: fstat: %w", dir, err)
	}
	switch {
	case !trustedOwner(st.Uid, uid):
		err = fmt.Errorf("cost cache directory %s is owned by uid %d, not by you (uid %d) or root: %w (use a directory of your own)",
			dir, st.Uid, uid, ErrUnsafeCostCache)
	case st.Mode&0o022 != 0:
		err = fmt.Errorf("cost cache directory %s has mode %04o, writable by group or others: %w (chmod go-w it or use another directory)",
			dir, st.Mode&0o7777, ErrUnsafeCostCache)
	}
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &costDir{fd: fd, path: dir}, nil
}

func trustedOwner(owner uint32, uid int) bool {
	return owner == 0 || int(owner) == uid
}

func (d *costDir) close() { unix.Close(d.fd) }

// read returns the contents of the regular file name in d, or an error
// wrapping fs.ErrNotExist if there is none. It opens without following a
// symlink and without blocking (a FIFO with no writer would block forever),
// refuses anything not a regular file and reads at most maxCostCacheSize.
func (d *costDir) read(name string) ([]byte, error) {
	full := filepath.Join(d.path, name)
	fd, err := unix.Openat(d.fd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			return nil, fmt.Errorf("cost cache %s is a symbolic link: %w (remove it; the cache is never read through a link)", full, ErrUnsafeCostCache)
		}
		return nil, &os.PathError{Op: "open cost cache", Path: full, Err: err}
	}
	f := os.NewFile(uintptr(fd), full)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("cost cache %s: fstat: %w", full, err)
	}
	if err := regularCostFile(full, uint32(st.Mode)); err != nil {
		return nil, err
	}
	if st.Size > maxCostCacheSize {
		return nil, fmt.Errorf("cost cache %s holds %d bytes, more than the %d a cache can: %w (remove it)", full, st.Size, maxCostCacheSize, ErrUnsafeCostCache)
	}
	// The size can grow after the Fstat: the limit still holds.
	data, err := io.ReadAll(io.LimitReader(f, maxCostCacheSize+1))
	if err != nil {
		return nil, fmt.Errorf("read cost cache %s: %w", full, err)
	}
	if len(data) > maxCostCacheSize {
		return nil, fmt.Errorf("cost cache %s grew beyond %d bytes while read: %w", full, maxCostCacheSize, ErrUnsafeCostCache)
	}
	return data, nil
}

// write replaces name in d with data: a new file created with O_EXCL (never
// an existing file or link) renamed over name, so that a reader sees the old
// or the new cache, never half of one. An existing name that is not a
// regular file is left alone and reported.
func (d *costDir) write(name string, data []byte) error {
	full := filepath.Join(d.path, name)
	var st unix.Stat_t
	switch err := unix.Fstatat(d.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); {
	case err == nil:
		if err := regularCostFile(full, uint32(st.Mode)); err != nil {
			return err
		}
	case !errors.Is(err, unix.ENOENT):
		return fmt.Errorf("cost cache %s: %w", full, err)
	}
	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return fmt.Errorf("save cost cache %s: %w", full, err)
	}
	tmp := ".load-costs-" + hex.EncodeToString(rnd[:])
	fd, err := unix.Openat(d.fd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return fmt.Errorf("save cost cache %s: create temporary file: %w", full, err)
	}
	f := os.NewFile(uintptr(fd), filepath.Join(d.path, tmp))
	_, werr := f.Write(data)
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = unix.Renameat(d.fd, tmp, d.fd, name)
	}
	if werr != nil {
		unix.Unlinkat(d.fd, tmp, 0)
		return fmt.Errorf("save cost cache %s: %w", full, werr)
	}
	return nil
}

// regularCostFile refuses anything but a regular file, naming what it is.
func regularCostFile(path string, mode uint32) error {
	if mode&unix.S_IFMT == unix.S_IFREG {
		return nil
	}
	return fmt.Errorf("cost cache %s is a %s, not a regular file: %w (pass the path of a regular file)", path, fileType(mode), ErrUnsafeCostCache)
}

func fileType(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return "directory"
	case unix.S_IFLNK:
		return "symbolic link"
	case unix.S_IFCHR:
		return "character device"
	case unix.S_IFBLK:
		return "block device"
	case unix.S_IFIFO:
		return "FIFO"
	case unix.S_IFSOCK:
		return "socket"
	}
	return fmt.Sprintf("file of type %#o", mode&unix.S_IFMT)
}
