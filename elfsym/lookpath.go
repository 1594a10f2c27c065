package elfsym

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/multiprobe/multiprobe/internal/fds"

	"github.com/multiprobe/multiprobe/internal/hostarch"
)

// LookPath finds the file a probe target names. A name with a '/' is a path
// and is returned as it is (after checking that it exists). A bare name is,
// in order: a file of that name in the current directory (as readelf or ls
// would take it); a library, found the way the dynamic loader finds one, in
// /etc/ld.so.cache and then the standard library directories; a program in
// $PATH. A bare library name without ".so" ("libc", "libssl") is a library
// of that name with any soname version ("libc.so.6"), as in bpftrace. Only
// files built for the host's architecture match a library or program name.
func LookPath(name string) (string, error) {
	return LookPathIn("", name)
}

// LookPathIn is LookPath inside another root directory, such as
// /proc/PID/root for a process in a container: the cache, the library
// directories and the returned path are all under root. Neither the
// current directory nor $PATH is searched inside a root, since they are
// the caller's, not the container's.
func LookPathIn(root, name string) (string, error) {
	if name == "" {
		return "", fmt.Errorf("empty target name: %w", ErrNotFound)
	}
	if strings.Contains(name, "/") {
		p := name
		if root != "" {
			p = inRoot(root, name)
		}
		// Opened rather than stat'ed: inside /proc/PID/root, only the
		// open resolves as the process would (fds.OpenRegular).
		f, err := fds.OpenRegular(p)
		if errors.Is(err, fds.ErrNotRegular) {
			return p, nil // the caller reports it with the file's type
		}
		if errors.Is(err, fs.ErrNotExist) {
			return "", &notFoundError{fmt.Sprintf("target %s: no such file or directory", p)}
		}
		if err != nil {
			return "", fmt.Errorf("target %s: %w", p, err) // EACCES, say: not "not found"
		}
		f.Close()
		return p, nil
	}
	if root == "" {
		if fi, err := os.Stat(name); err == nil && fi.Mode().IsRegular() {
			if abs, err := filepath.Abs(name); err == nil {
				return abs, nil
			}
		}
	}
	exact := func(key string) bool { return key == name }
	if p, ok := ldCacheLookup(root, exact); ok {
		return p, nil
	}
	for _, dir := range libDirs() {
		p := inRoot(root, filepath.Join(dir, name))
		if hostELF(p) {
			return p, nil
		}
	}
	if strings.HasPrefix(name, "lib") && !strings.Contains(name, ".so") {
		// "libc": libc.so, or libc.so.N for any N.
		versioned := func(key string) bool {
			rest, ok := strings.CutPrefix(key, name+".so")
			return ok && (rest == "" || rest[0] == '.')
		}
		if p, ok := ldCacheLookup(root, versioned); ok {
			return p, nil
		}
		for _, dir := range libDirs() {
			matches, _ := filepath.Glob(inRoot(root, filepath.Join(dir, name+".so*")))
			for _, p := range matches {
				if versioned(filepath.Base(p)) && hostELF(p) {
					return p, nil
				}
			}
		}
	}
	where := "/etc/ld.so.cache or the library directories"
	if root == "" {
		for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
			if dir == "" {
				continue
			}
			p := filepath.Join(dir, name)
			if hostELF(p) {
				return p, nil
			}
		}
		where = "the current directory, /etc/ld.so.cache, the library directories or $PATH"
	} else {
		where = fmt.Sprintf("%s's /etc/ld.so.cache or library directories", root)
	}
	return "", &notFoundError{fmt.Sprintf("target %q: not found in %s (give a path: ./%s, /usr/lib/..., or a library's name such as libc.so.6)",
		name, where, name)}
}

// notFoundError is a bare name LookPathIn did not find: ErrNotFound and
// fs.ErrNotExist, with a message that says where it looked in one line.
type notFoundError struct{ msg string }

func (e *notFoundError) Error() string   { return e.msg }
func (e *notFoundError) Unwrap() []error { return []error{ErrNotFound, fs.ErrNotExist} }

// ProcessRoot is the root directory in which to look up the files process
// pid names: /proc/PID/root when its root or its mounts differ from this
// process's (a container, a chroot, a private mount namespace: unshare -m
// and a bind mount over a directory, whose root directory is ours but
// whose paths are not), else "" (this process's own root, where the same
// names mean the same files and paths stay short). /proc/PID/root walks
// the process's own mounts.
func ProcessRoot(pid int) string {
	proc := "/proc/" + strconv.Itoa(pid)
	theirs, err1 := os.Stat(proc + "/root")
	ours, err2 := os.Stat("/")
	if err1 != nil || err2 != nil {
		return ""
	}
	if !os.SameFile(theirs, ours) {
		return proc + "/root"
	}
	theirNS, err1 := os.Stat(proc + "/ns/mnt")
	ourNS, err2 := os.Stat("/proc/self/ns/mnt")
	if err1 != nil || err2 != nil || os.SameFile(theirNS, ourNS) {
		return ""
	}
	return proc + "/root"
}

// inRoot names p inside root: p is cleaned as an absolute path first, so
// that no ".." in it (an ld.so.cache entry of a container, say) climbs out
// of root; symbolic links inside root are confined when the file is opened
// (fds.OpenRegular).
func inRoot(root, p string) string {
	if root == "" {
		return p
	}
	return root + filepath.Clean("/"+p)
}

// libDirs are the directories the dynamic loader searches after its cache:
// Debian's multiarch ones, then the traditional ones.
func libDirs() []string {
	var triplet string
	switch runtime.GOARCH {
	case "amd64":
		triplet = "x86_64-linux-gnu"
	case "arm64":
		triplet = "aarch64-linux-gnu"
	case "riscv64":
		triplet = "riscv64-linux-gnu"
	case "s390x":
		triplet = "s390x-linux-gnu"
	case "ppc64le":
		triplet = "powerpc64le-linux-gnu"
	}
	var dirs []string
	if triplet != "" {
		dirs = append(dirs, "/lib/"+triplet, "/usr/lib/"+triplet)
	}
	return append(dirs, "/lib64", "/usr/lib64", "/lib", "/usr/lib")
}

// hostELF reports whether path is a regular 64-bit ELF file for the host.
func hostELF(path string) bool {
	f, err := fds.OpenRegular(path)
	if err != nil {
		return false
	}
	defer f.Close()
	var hdr [20]byte
	if _, err := f.ReadAt(hdr[:], 0); err != nil {
		return false
	}
	return bytes.HasPrefix(hdr[:], []byte(elf.ELFMAG)) &&
		elf.Class(hdr[elf.EI_CLASS]) == elf.ELFCLASS64 &&
		elf.Machine(binary.LittleEndian.Uint16(hdr[18:])) == hostarch.Machine
}

// ldCacheMagic starts the format glibc has written since 2.32 (and, after
// the old format, before that). The old format alone is not read: no
// supported distribution writes only it.
const ldCacheMagic = "glibc-ld.so.cache1.1"

// maxLdCache bounds what is read of an ld.so.cache.
const maxLdCache = 16 << 20

// ldCacheLookup finds name in root's /etc/ld.so.cache. Entries for other
// architectures (a multilib i386 libc, say) are skipped by checking the file.
func ldCacheLookup(root string, match func(key string) bool) (string, bool) {
	f, err := fds.OpenRegular(inRoot(root, "/etc/ld.so.cache"))
	if err != nil {
		return "", false
	}
	defer f.Close()
	// A real cache is a few hundred kilobytes; a container's could be
	// anything.
	data, err := io.ReadAll(io.LimitReader(f, maxLdCache))
	if err != nil {
		return "", false
	}
	for _, p := range parseLdCache(data, match) {
		p = inRoot(root, p)
		if hostELF(p) {
			return p, true
		}
	}
	return "", false
}

// parseLdCache returns the paths that the cache lists for the names that
// match, in order.
// The new-format table is: magic (20 bytes), nlibs (u32), string table
// length (u32), flags and padding up to 48 bytes, then nlibs entries of 24
// bytes (flags i32, key u32, value u32, osversion u32, hwcap u64), whose key
// and value are offsets from the start of the new-format header.
func parseLdCache(data []byte, match func(key string) bool) []string {
	start := bytes.Index(data, []byte(ldCacheMagic))
	if start < 0 {
		return nil
	}
	hdr := data[start:]
	if len(hdr) < 48 {
		return nil
	}
	n := int(binary.LittleEndian.Uint32(hdr[20:]))
	const entSize = 24
	if n < 0 || n > (len(hdr)-48)/entSize {
		return nil
	}
	var out []string
	for i := 0; i < n; i++ {
		e := hdr[48+i*entSize:]
		key, ok1 := cstring(hdr, binary.LittleEndian.Uint32(e[4:]))
		val, ok2 := cstring(hdr, binary.LittleEndian.Uint32(e[8:]))
		if ok1 && ok2 && match(string(key)) {
			out = append(out, string(val))
		}
	}
	return out
}

// A Mapping is a file that a process has mapped executable.
type Mapping struct {
	// Path is the file's path as the process names it: in its own mount
	// namespace, and inside its root directory if it is chrooted.
	Path string
	// HostPath reaches the very file mapped from this process: through
	// /proc/PID/root where the process's path leads there to that file,
	// else by the path /proc/PID/maps gives (a chrooted process's files
	// are reachable from this root, and the maps name them so: through
	// /proc/PID/root they would be under the chroot twice), else, for a
	// file since deleted or replaced, or where an overlay shows other
	// inode numbers than the maps, through /proc/PID/map_files (which
	// needs CAP_SYS_ADMIN). Failing all, it is the /proc/PID/root path.
	HostPath string
	// HostDev and HostIno are the device and inode stat gives for
	// HostPath, as it was found (0 if it could not be checked): a
	// caller that opens HostPath can tell, by fstat, that it opened the
	// file mapped and not one put at its path since.
	HostDev, HostIno uint64
	// Deleted reports that the file was deleted or replaced after the
	// process mapped it.
	Deleted bool
	// Major, Minor and Inode are the file's device and inode as the
	// maps show them: behind an overlay (from about Linux 6.8), the
	// overlay mount's device with the real file's inode number.
	Major, Minor uint32
	Inode        uint64
	// Start is where the file's first executable mapping begins.
	Start uint64
}

// ExecutableMappings lists the files that process pid has mapped
// executable, in the order of /proc/PID/maps, each once.
func ExecutableMappings(pid int) ([]Mapping, error) {
	return ExecutableMappingsIf(pid, nil)
}

// ExecutableMappingsIf is ExecutableMappings of the files for which keep,
// if not nil, returns true: it is given each Mapping without its HostPath,
// which is found (a stat or more for each) only for the ones kept. A
// watcher of mappings keeps the one an event names, or the ones whose
// path matches, and pays nothing for the rest.
func ExecutableMappingsIf(pid int, keep func(Mapping) bool) ([]Mapping, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/maps")
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("process %d: %w (it does not exist or has exited)", pid, err)
		}
		return nil, fmt.Errorf("process %d: %w", pid, err)
	}
	return executableFiles(parseMaps(data), pid, keep), nil
}

func executableFiles(maps []mapsLine, pid int, keep func(Mapping) bool) []Mapping {
	proc := "/proc/" + strconv.Itoa(pid)
	root := proc + "/root"
	// The maps give a path from this process's root where the file is
	// reachable from it: a chrooted process's files under its root
	// directory as this process sees it.
	chroot, _ := os.Readlink(root)
	if chroot == "/" {
		chroot = ""
	}
	seen := map[string]bool{}
	var out []Mapping
	for _, pm := range maps {
		if !pm.Exec || !strings.HasPrefix(pm.Path, "/") {
			continue // [vdso], anonymous and the like
		}
		m := Mapping{Path: pm.Path, Major: pm.Major, Minor: pm.Minor, Inode: pm.Inode, Start: pm.Start}
		if p, ok := strings.CutSuffix(pm.Path, " (deleted)"); ok {
			m.Path, m.Deleted = p, true
		}
		if seen[m.Path] {
			continue
		}
		seen[m.Path] = true
		ours := m.Path
		if rest, ok := strings.CutPrefix(m.Path, chroot+"/"); ok && chroot != "" {
			m.Path = "/" + rest
		}
		if keep != nil && !keep(m) {
			continue
		}
		m.HostPath, m.HostDev, m.HostIno = reach(pm.Inode, fmt.Sprintf("%s/map_files/%x-%x", proc, pm.Start, pm.End), root+m.Path, ours)
		out = append(out, m)
	}
	return out
}

// reach returns the first of paths that leads to the file mapped, which
// mapFiles (/proc/PID/map_files/START-END) opens, else mapFiles itself;
// with the device and inode stat gives for it. A path is the file if stat
// gives both the same as for mapFiles: the inode number alone is not
// enough (two tmpfs mounts number their files alike, and a symbolic link
// in a container's tree may lead out of it to another file of that
// number), and the maps' device is not stat's on btrfs (a subvolume's
// own) or behind an overlay. Where mapFiles cannot be read (it needs
// CAP_SYS_ADMIN), the first path of the maps' inode number ino, else the
// first path.
func reach(ino uint64, mapFiles string, paths ...string) (string, uint64, uint64) {
	var want syscall.Stat_t
	if syscall.Stat(mapFiles, &want) == nil {
		for _, p := range paths {
			var st syscall.Stat_t
			if syscall.Stat(p, &st) == nil && st.Dev == want.Dev && st.Ino == want.Ino {
				return p, uint64(want.Dev), uint64(want.Ino)
			}
		}
		return mapFiles, uint64(want.Dev), uint64(want.Ino)
	}
	for _, p := range paths {
		var st syscall.Stat_t
		if syscall.Stat(p, &st) == nil && uint64(st.Ino) == ino {
			return p, uint64(st.Dev), uint64(st.Ino)
		}
	}
	return paths[0], 0, 0
}

// GlobIn returns the files a target path with globs names
// (/usr/lib/*/libssl.so*) in root ("" for this process's, or a
// ProcessRoot), sorted, each file once: the symbolic links to one file
// (libssl.so, libssl.so.3) are one, by the file's own name where root is
// this process's. A pattern must be an absolute path; none matching is an
// error wrapping ErrNotFound.
func GlobIn(root, pattern string) ([]string, error) {
	if !filepath.IsAbs(pattern) {
		return nil, fmt.Errorf("target %q: %w: a glob must be in an absolute path", pattern, ErrBadPattern)
	}
	matches, err := filepath.Glob(root + filepath.Clean(pattern))
	if err != nil {
		return nil, fmt.Errorf("target %q: %w", pattern, ErrBadPattern)
	}
	if len(matches) == 0 {
		return nil, &notFoundError{fmt.Sprintf("target %q: no file matches", pattern)}
	}
	slices.Sort(matches)
	seen := map[string]bool{}
	files := matches[:0]
	for _, m := range matches {
		if real, err := filepath.EvalSymlinks(m); err == nil {
			if seen[real] {
				continue
			}
			seen[real] = true
			if root == "" {
				m = real
			}
		}
		files = append(files, m)
	}
	return files, nil
}
