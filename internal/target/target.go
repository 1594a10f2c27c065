// Package target holds the sites of one attach call as both attach paths
// take them: package attach (uprobe_multi links) and package fallback
// (per-site perf-event uprobes) are peers over this type, so that they
// accept the same targets, check them the same way and give the same
// default cookies.
package target

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/multiprobe/multiprobe/kernelprobe"
)

var (
	// ErrInvalidTarget: a Target is malformed (no path or offsets, slices of
	// different lengths, an offset past the end of the file, an odd
	// ref-counter offset, a path that is not a regular file).
	ErrInvalidTarget = errors.New("invalid target")
	// ErrWrongProgram: the program cannot be attached this way: it is not a
	// kprobe-type program, or it was loaded for the other attach path (its
	// expected attach type is not the one the link needs).
	ErrWrongProgram = errors.New("program not loaded for this attach type")
	// ErrInvalidOptions: options are inconsistent (Session with Return, a
	// negative PID).
	ErrInvalidOptions = errors.New("invalid options")
)

// Unsupported returns a sentinel for a kernel feature that is missing,
// with msg as its text: it wraps ebpf.ErrNotSupported, as cilium/ebpf's
// own missing-feature errors do, so that a caller can test for either.
func Unsupported(msg string) error { return &unsupported{msg} }

type unsupported struct{ msg string }

func (e *unsupported) Error() string { return e.msg }
func (e *unsupported) Unwrap() error { return ebpf.ErrNotSupported }

// Target is one binary and the sites to probe in it.
type Target struct {
	// Path of the binary or shared library. Without File, the kernel
	// resolves it when the link is made, following symbolic links.
	Path string
	// File, if not nil, is Path opened by the caller when it resolved the
	// sites. The kernel is then handed this open file (through
	// /proc/self/fd), so that a rename or replace of Path in between
	// cannot change what is probed; Path only names it in messages.
	File *os.File
	// Offsets are the sites' file offsets (not virtual addresses).
	Offsets []uint64
	// RefCtrOffsets, if not nil, holds one ref-counter (USDT semaphore) file
	// offset per site, 0 for none. The kernel increments the counter while
	// the site is probed. Non-zero values must be even.
	RefCtrOffsets []uint64
	// Cookies, if not nil, holds one BPF cookie per site. If nil, a site's
	// cookie is its index among all sites of the call: the sites of
	// targets[0] get 0 … len-1, those of targets[1] continue from there.
	Cookies []uint64
	// Names, if not nil, names every site (a symbol, say) for error
	// messages. It does not reach the kernel.
	Names []string
}

// KernelPath is the path to hand the kernel: File's /proc/self/fd entry,
// or Path.
func (t *Target) KernelPath() string {
	if t.File != nil {
		return fmt.Sprintf("/proc/self/fd/%d", t.File.Fd())
	}
	return t.Path
}

// Targets is the set of targets of one attach call.
type Targets []Target

// Clone returns a copy of ts that shares no slice with it: what a caller
// does to it changes nothing a link attached.
func (ts Targets) Clone() Targets {
	out := slices.Clone(ts)
	for i := range out {
		t := &out[i]
		t.Offsets, t.RefCtrOffsets = slices.Clone(t.Offsets), slices.Clone(t.RefCtrOffsets)
		t.Cookies, t.Names = slices.Clone(t.Cookies), slices.Clone(t.Names)
	}
	return out
}

// Sites returns the number of sites over all targets.
func (ts Targets) Sites() int {
	n := 0
	for _, t := range ts {
		n += len(t.Offsets)
	}
	return n
}

// Cookies returns every site's cookie, in the order of the targets and
// their offsets.
func (ts Targets) Cookies() []uint64 {
	out := make([]uint64, 0, ts.Sites())
	for _, t := range ts {
		out = append(out, t.Cookies...)
	}
	return out
}

// Prepare checks targets as every attach path needs them and returns them
// with the default cookies filled in. The result shares the targets'
// slices. pkg prefixes the messages ("attach", "fallback").
func Prepare(pkg string, targets []Target) (Targets, error) {
	if len(targets) == 0 {
		return nil, fmt.Errorf("%s: no targets: %w", pkg, ErrInvalidTarget)
	}
	out := make([]Target, len(targets))
	var next uint64 // the default cookie of the next site
	for i, t := range targets {
		n := len(t.Offsets)
		if t.Path == "" {
			return nil, fmt.Errorf("%s: target %d has no path: %w", pkg, i, ErrInvalidTarget)
		}
		if strings.IndexByte(t.Path, 0) >= 0 {
			return nil, fmt.Errorf("%s: target %d: path %q contains NUL: %w", pkg, i, t.Path, ErrInvalidTarget)
		}
		if n == 0 {
			return nil, fmt.Errorf("%s: %s: no offsets: %w", pkg, t.Path, ErrInvalidTarget)
		}
		for _, s := range []struct {
			name string
			len  int
			set  bool
		}{
			{"RefCtrOffsets", len(t.RefCtrOffsets), t.RefCtrOffsets != nil},
			{"Cookies", len(t.Cookies), t.Cookies != nil},
			{"Names", len(t.Names), t.Names != nil},
		} {
			if s.set && s.len != n {
				return nil, fmt.Errorf("%s: %s: %d %s for %d offsets (want nil or one per offset): %w", pkg, t.Path, s.len, s.name, n, ErrInvalidTarget)
			}
		}

		var st os.FileInfo
		var err error
		if t.File != nil {
			st, err = t.File.Stat()
		} else {
			st, err = os.Stat(t.Path)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %s%w", pkg, Of(i, len(targets)), err)
		}
		if !st.Mode().IsRegular() {
			return nil, fmt.Errorf("%s: %s is not a regular file (mode %v): %w", pkg, t.Path, st.Mode(), ErrInvalidTarget)
		}
		size := uint64(st.Size())
		for j, off := range t.Offsets {
			if off == 0 {
				// Offset 0 is the ELF header, never code: an undefined
				// symbol's value taken for an offset.
				return nil, fmt.Errorf("%s: %s: site %s: offset 0 is the ELF header, not code: %w", pkg, t.Path, SiteName(&t, j), ErrInvalidTarget)
			}
			if off >= size {
				return nil, fmt.Errorf("%s: %s: site %s: offset %#x is past the end of the file (%d bytes); offsets are file offsets, not addresses: %w",
					pkg, t.Path, SiteName(&t, j), off, size, ErrInvalidTarget)
			}
		}
		for j, rc := range t.RefCtrOffsets {
			if rc%2 != 0 {
				return nil, fmt.Errorf("%s: %s: site %s: ref-counter offset %#x is odd (the kernel needs 2-byte alignment): %w",
					pkg, t.Path, SiteName(&t, j), rc, ErrInvalidTarget)
			}
		}

		c := t
		if c.Cookies == nil {
			c.Cookies = make([]uint64, n)
			for j := range c.Cookies {
				c.Cookies[j] = next + uint64(j)
			}
		}
		next += uint64(n)
		out[i] = c
	}
	return out, nil
}

// Of names target i of n in messages, if there are several.
func Of(i, n int) string {
	if n == 1 {
		return ""
	}
	return fmt.Sprintf("target %d of %d, ", i+1, n)
}

// SiteName names site j of t in messages: its name if it has one, its
// index and offset.
func SiteName(t *Target, j int) string {
	if j < len(t.Names) && t.Names[j] != "" {
		return fmt.Sprintf("%s (#%d, offset %#x)", t.Names[j], j, t.Offsets[j])
	}
	return fmt.Sprintf("#%d (offset %#x)", j, t.Offsets[j])
}

// A Refusal is a site the kernel refused, with what made it refuse, left
// out of a link made with the option to leave such sites out
// (attach.Options.LeaveOutRefused, fallback.Options.LeaveOutRefused).
type Refusal struct {
	// Target is the index of the site's target in the attach call, Site
	// its index in that target's Offsets (as the caller gave them), and
	// Offset its file offset.
	Target, Site int
	Offset       uint64
	// Err says why (see Why), and wraps the kernel's errno (and
	// kernelprobe.ErrUnprobeable where the kernel will not probe the
	// instruction); the binary and site are the fields above.
	Err error
}

// MaxRefusals bounds the sites one attach call leaves out: finding each
// costs a few attach attempts, and a kernel that refuses more sites than
// this is refusing something other than the sites (a program, a file).
const MaxRefusals = 256

// Refusable reports whether the kernel's errno for a site's uprobe is
// about that site, so that the others may still be attached: EINVAL
// (another uprobe at the offset with another ref-counter offset, or an
// offset not at an instruction), ENOTSUPP (an instruction the kernel will
// not probe) and ENOEXEC (one its decoder does not know).
func Refusable(errno unix.Errno) bool {
	return errno == unix.EINVAL || errno == ErrnoENOTSUPP || errno == unix.ENOEXEC
}

// ErrnoENOTSUPP is the kernel's internal ENOTSUPP (524), which uprobe
// registration returns for an instruction it cannot probe; x/sys/unix has
// no name for it.
const ErrnoENOTSUPP = unix.Errno(524)

// Without returns t without the sites at the indexes drop (sorted, each
// in range): new slices, t's own untouched.
func (t Target) Without(drop []int) Target {
	kept := func(n int, keep func(j int)) {
		k := 0
		for j := range n {
			if k < len(drop) && drop[k] == j {
				k++
				continue
			}
			keep(j)
		}
	}
	without := func(s []uint64) []uint64 {
		if s == nil {
			return nil
		}
		out := make([]uint64, 0, len(s)-len(drop))
		kept(len(s), func(j int) { out = append(out, s[j]) })
		return out
	}
	out := t
	out.Offsets, out.RefCtrOffsets, out.Cookies = without(t.Offsets), without(t.RefCtrOffsets), without(t.Cookies)
	if t.Names != nil {
		out.Names = make([]string, 0, len(t.Names)-len(drop))
		kept(len(t.Names), func(j int) { out.Names = append(out.Names, t.Names[j]) })
	}
	return out
}

// Why says why the kernel refused site j of t alone, and what to do, for
// a Refusal; it wraps errno.
func Why(errno unix.Errno, t *Target, j int) error {
	switch errno {
	case unix.EINVAL:
		// The kernel keeps one uprobe per inode and offset, and refuses
		// a second consumer that asks for another ref-counter offset
		// there (uprobes.c, ref_ctr_mismatch_warn): a probe another
		// tracer left, such as one bcc placed with a USDT semaphore's.
		rc := uint64(0)
		if t.RefCtrOffsets != nil {
			rc = t.RefCtrOffsets[j]
		}
		if other, ok := refCtrInLog(t, t.Offsets[j]); ok {
			return fmt.Errorf("another uprobe at %s+%#x has ref-counter offset %#x, this one %#x (another tracer's probe: bpftool perf and bpftool link list them) (EINVAL): %w",
				filepath.Base(t.Path), t.Offsets[j], other, rc, errno)
		}
		return fmt.Errorf("another uprobe at %s+%#x has a ref-counter offset other than %#x (another tracer's probe: bpftool perf and bpftool link list them, the kernel log names its offset), or the offset is not at an instruction (EINVAL): %w",
			filepath.Base(t.Path), t.Offsets[j], rc, errno)
	case ErrnoENOTSUPP:
		return fmt.Errorf("the kernel will not place a uprobe at the instruction at %s+%#x (ENOTSUPP, errno 524): %w: %w", filepath.Base(t.Path), t.Offsets[j], kernelprobe.ErrUnprobeable, errno)
	case unix.ENOEXEC:
		return fmt.Errorf("the kernel's instruction decoder does not know the instruction at %s+%#x: %w: %w", filepath.Base(t.Path), t.Offsets[j], kernelprobe.ErrUnprobeable, errno)
	}
	return fmt.Errorf("the kernel refused %s+%#x: %w", filepath.Base(t.Path), t.Offsets[j], errno)
}

// JoinRefusals is refused as one error, each naming its binary and site
// of targets (as given to the call).
func JoinRefusals(targets []Target, refused []Refusal) error {
	errs := make([]error, len(refused))
	for i, r := range refused {
		t := &targets[r.Target]
		errs[i] = fmt.Errorf("%s (site %s): %w", t.Path, SiteName(t, r.Site), r.Err)
	}
	return errors.Join(errs...)
}
