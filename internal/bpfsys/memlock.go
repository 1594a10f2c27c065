package bpfsys

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

var (
	memlockOnce sync.Once
	memlockErr  error
)

// RaiseMemlock lifts RLIMIT_MEMLOCK to infinity, once per process, on kernels
// that charge BPF memory to it: those before Linux 5.11, which moved the
// charge to the memory cgroup. On later kernels it changes nothing, so the
// process (and every child it starts) keeps its limit.
//
// cilium/ebpf's rlimit package does the same but decides by creating a map
// with the limit lowered to zero, in an init function, so that every program
// importing it pays a bpf(2) call at start-up (0.75 ms, a tenth of a whole
// `multiprobe list`) whether it loads anything or not. The kernel's version
// answers the same question without a syscall beyond uname.
//
// Without CAP_SYS_RESOURCE the raise fails with EPERM, returned wrapped.
func RaiseMemlock() error {
	memlockOnce.Do(func() {
		var uts unix.Utsname
		if err := unix.Uname(&uts); err != nil {
			memlockErr = fmt.Errorf("uname: %w", err)
			return
		}
		if !chargesMemlock(unix.ByteSliceToString(uts.Release[:])) {
			return
		}
		if err := unlimitMemlock(); err != nil {
			memlockErr = fmt.Errorf("raise RLIMIT_MEMLOCK (BPF memory counts against it before Linux 5.11): %w", err)
		}
	})
	return memlockErr
}

// chargesMemlock reports whether a kernel of this release (as uname -r
// prints it) charges BPF memory to RLIMIT_MEMLOCK. A release it cannot read
// is taken to: raising the limit is harmless where it is not needed.
func chargesMemlock(release string) bool {
	major, minor, err := majorMinor(release)
	if err != nil {
		return true
	}
	return major < 5 || major == 5 && minor < 11
}

var errRelease = errors.New("not a kernel release")

func majorMinor(release string) (major, minor int, err error) {
	ma, rest, ok := strings.Cut(release, ".")
	if !ok {
		return 0, 0, errRelease
	}
	mi := rest
	if i := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		mi = rest[:i]
	}
	if major, err = strconv.Atoi(ma); err != nil {
		return 0, 0, errRelease
	}
	if minor, err = strconv.Atoi(mi); err != nil {
		return 0, 0, errRelease
	}
	return major, minor, nil
}
