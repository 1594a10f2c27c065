package ifunc

import (
	"bufio"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"github.com/multiprobe/multiprobe/internal/fds"
	"golang.org/x/sys/unix"

	"github.com/multiprobe/multiprobe/internal/hostarch"
)

// helperPath returns the system's true(1), at a fixed path: not through
// $PATH, whose directories a user other than root may write, since the
// helper may run as root (helperCredential).
func helperPath() (string, error) {
	var errs []error
	for _, p := range []string{"/usr/bin/true", "/bin/true"} {
		st, err := os.Stat(p)
		if err == nil && st.Mode().IsRegular() {
			return p, nil
		}
		if err == nil {
			err = fmt.Errorf("%s: not a regular file", p)
		}
		errs = append(errs, err)
	}
	return "", errors.Join(errs...)
}

// nobody is the user and group of a helper that runs code nobody vouches
// for.
const nobody = 65534

// helperCredential is who the helper runs the library's code as: its
// resolvers and constructors can do anything their user can. multiprobe
// is often root, and a library is not always root's: run as root, a
// user's library, or a container's, would be a way to root. So the code
// runs as the file's owner; a root-owned file that others may write, as
// nobody; a root-owned file only root may write, as root, which could
// have run it anyway. Without root, as multiprobe's own user, whose
// capabilities exec drops.
func helperCredential(st *unix.Stat_t) *syscall.Credential {
	switch {
	case os.Geteuid() != 0:
		return nil
	case st.Uid != 0:
		return &syscall.Credential{Uid: st.Uid, Gid: nobody, Groups: []uint32{}}
	case st.Mode&0o022 != 0:
		return &syscall.Credential{Uid: nobody, Gid: nobody, Groups: []uint32{}}
	}
	return nil
}

// ErrUnsupported is returned for a file or machine Resolve cannot run
// resolvers for: an executable (it would have to run the program itself),
// another architecture, or no /bin/true to host the library.
var ErrUnsupported = errors.New("cannot resolve IFUNCs")

// Resolve returns, for each resolver (the value of an IFUNC symbol of the
// shared library at path, a virtual address as its symbol table gives
// it), the virtual address, in the same terms, of the implementation this
// machine's loader selects; 0 where a resolver's result is not in the
// library (an error says which, joined with the others).
func Resolve(path string, resolvers []uint64) ([]uint64, error) {
	if len(resolvers) == 0 {
		return nil, nil
	}
	return onLibrary(path, func(f *os.File, ef *elf.File) ([]uint64, []error, error) {
		return resolve(path, f, ef, resolvers)
	})
}

// onLibrary opens the library at path, confined to a process's root if
// path is in one (fds.OpenRegular), and runs fn on it: Resolve's and
// ResolveIn's common part, with fn's reasons per resolver joined.
func onLibrary(path string, fn func(f *os.File, ef *elf.File) ([]uint64, []error, error)) ([]uint64, error) {
	f, err := fds.OpenRegular(path)
	if err != nil {
		return nil, fmt.Errorf("ifunc: %w", err)
	}
	defer f.Close()
	ef, err := elf.NewFile(f)
	if err != nil {
		return nil, fmt.Errorf("ifunc: %s: %w", path, err)
	}
	out, whys, err := fn(f, ef)
	if err != nil {
		return nil, err
	}
	return out, errors.Join(whys...)
}

// resolve is Resolve for the library at path, open as f and read as ef.
// Where a resolver's result is not in the library, its entry of out is 0
// and its entry of whys says why; err is for a failure of the whole call.
func resolve(path string, f *os.File, ef *elf.File, resolvers []uint64) (out []uint64, whys []error, err error) {
	// A PIE is ET_DYN too; it says so in DT_FLAGS_1. (libc.so.6 has an
	// interpreter, and runs, but is a library.)
	flags, _ := ef.DynValue(elf.DT_FLAGS_1)
	if ef.Type != elf.ET_DYN || (len(flags) > 0 && flags[0]&uint64(elf.DF_1_PIE) != 0) {
		return nil, nil, fmt.Errorf("ifunc: %s: %w: not a shared library (an executable's resolvers run only in the executable)", path, ErrUnsupported)
	}
	if len(breakpoint) == 0 {
		return nil, nil, fmt.Errorf("ifunc: %s: %w: multiprobe runs resolvers on linux/amd64 and linux/arm64, not on %s/%s", path, ErrUnsupported, runtime.GOOS, runtime.GOARCH)
	}
	if ef.Machine != hostarch.Machine {
		return nil, nil, fmt.Errorf("ifunc: %s: %w: a %s library on a %s machine", path, ErrUnsupported, ef.Machine, hostarch.Machine)
	}
	id, err := mapsID(f)
	if err != nil {
		return nil, nil, fmt.Errorf("ifunc: %s: %w", path, err)
	}
	helper, err := helperPath()
	if err != nil {
		return nil, nil, fmt.Errorf("ifunc: %w: no true(1) to load %s into: %w", ErrUnsupported, path, err)
	}

	return runResolvers(path, f, ef, helper, id, resolvers)
}

// mappingAt names the mapping of process pid that holds addr, as
// /proc/PID/maps does ("[vdso]", a path), or says there is none.
func mappingAt(pid int, addr uint64) string {
	fields, err := mapsLine(fmt.Sprintf("/proc/%d/maps", pid), addr)
	switch {
	case err != nil:
		return "a mapping that could not be read"
	case fields == nil:
		return "no mapping"
	case len(fields) < 6:
		return "an anonymous mapping"
	}
	return strings.Join(fields[5:], " ")
}

// mapsLine returns the fields of the line of the maps file at path (a
// /proc/PID/maps) whose range holds addr: start-end, perms, offset, dev,
// inode and, if any, the path. It returns nil if no line does.
func mapsLine(path string, addr uint64) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		start, end, _ := strings.Cut(fields[0], "-")
		s, _ := strconv.ParseUint(start, 16, 64)
		e, _ := strconv.ParseUint(end, 16, 64)
		if addr >= s && addr < e {
			return fields, nil
		}
	}
	return nil, sc.Err()
}

// auxv returns an entry of the tracee's auxiliary vector.
func auxv(pid int, key uint64) (uint64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/auxv", pid))
	if err != nil {
		return 0, err
	}
	for ; len(data) >= 16; data = data[16:] {
		if binary.NativeEndian.Uint64(data) == key {
			return binary.NativeEndian.Uint64(data[8:]), nil
		}
	}
	return 0, fmt.Errorf("auxiliary vector has no entry %d", key)
}

// A fileID is a file as /proc/PID/maps names it: device and inode.
type fileID struct {
	dev string // "maj:min", in hexadecimal
	ino uint64
}

// mapsID returns the device and inode that /proc/PID/maps shows for a
// mapping of f, found by mapping a page of it here. fstat can differ: on
// overlayfs (a container's files) before Linux 6.8, maps shows the
// underlying layer's device where fstat shows the overlay's.
func mapsID(f *os.File) (fileID, error) {
	page := os.Getpagesize()
	m, err := unix.Mmap(int(f.Fd()), 0, page, unix.PROT_READ, unix.MAP_PRIVATE)
	if err != nil {
		return fileID{}, fmt.Errorf("mapping it: %w", err)
	}
	defer unix.Munmap(m)
	fields, err := mapsLine("/proc/self/maps", uint64(uintptr(unsafe.Pointer(unsafe.SliceData(m)))))
	if err != nil {
		return fileID{}, err
	}
	if fields == nil {
		return fileID{}, errors.New("its mapping is not in /proc/self/maps")
	}
	ino, err := strconv.ParseUint(fields[4], 10, 64)
	return fileID{dev: fields[3], ino: ino}, err
}

// loadBias returns what the loader added to the library's virtual
// addresses in process pid, and the range its mappings span there. The
// library is the file id names, found by device and inode as maps shows
// them (mapsID), so that a path through a symlink or /proc/PID/root is
// found too.
func loadBias(pid int, id fileID, ef *elf.File) (bias, lo, hi uint64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return 0, 0, 0, err
	}
	defer f.Close()
	found, base := false, uint64(0)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// start-end perms offset dev inode path
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		if inode, _ := strconv.ParseUint(fields[4], 10, 64); inode != id.ino || fields[3] != id.dev {
			continue
		}
		start, end, _ := strings.Cut(fields[0], "-")
		s, _ := strconv.ParseUint(start, 16, 64)
		e, _ := strconv.ParseUint(end, 16, 64)
		off, _ := strconv.ParseUint(fields[2], 16, 64)
		if !found || s < lo {
			lo = s
		}
		if !found || e > hi {
			hi = e
		}
		if off == 0 && (base == 0 || s < base) {
			base = s
		}
		found = true
	}
	if err := sc.Err(); err != nil {
		return 0, 0, 0, err
	}
	if !found || base == 0 {
		return 0, 0, 0, errNotMapped
	}
	// The mapping at file offset 0 holds the first PT_LOAD segment.
	bias = base
	for _, p := range ef.Progs {
		if p.Type == elf.PT_LOAD {
			bias -= p.Vaddr &^ (uint64(os.Getpagesize()) - 1)
			break
		}
	}
	return bias, lo, hi, nil
}

// errNotMapped: the process maps no part of the library.
var errNotMapped = errors.New("not mapped")

// Auxiliary vector keys (<elf.h>).
const (
	atEntry = 9  // AT_ENTRY: the program's entry point
	atHWCap = 16 // AT_HWCAP: the CPU's features, as arm64 resolvers take
)
