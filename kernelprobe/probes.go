package kernelprobe

import (
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/multiprobe/multiprobe/internal/bpfsys"
	"golang.org/x/sys/unix"
)

const (
	uprobePMUType   = "/sys/bus/event_source/devices/uprobe/type"
	uprobePMURefCtr = "/sys/bus/event_source/devices/uprobe/format/ref_ctr_offset"
)

// probeAll runs every probe. It stops at the first unexpected error, so
// that a missing capability is reported instead of being mistaken for a
// missing feature.
func probeAll() (Features, error) {
	var f Features
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return f, fmt.Errorf("kernelprobe: uname: %w", err)
	}
	f.Release = unix.ByteSliceToString(uts.Release[:])

	var err error
	if f.UprobePMU, err = exists(uprobePMUType); err != nil {
		return f, err
	}
	if f.RefCtrOffset, err = exists(uprobePMURefCtr); err != nil {
		return f, err
	}

	switch err := features.HaveProgramHelper(ebpf.Kprobe, asm.FnGetAttachCookie); {
	case err == nil:
		f.Cookies = true
	case errors.Is(err, ebpf.ErrNotSupported):
	default:
		return f, probeError("BPF cookies", err)
	}

	if f.UprobeMulti, f.UprobeMultiPIDFilter, err = probeUprobeMulti(); err != nil {
		return f, err
	}
	if f.UprobeMulti {
		if f.UprobeSession, err = probeUprobeSession(); err != nil {
			return f, err
		}
	}
	return f, nil
}

func exists(path string) (bool, error) {
	_, err := os.Stat(path)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, os.ErrNotExist):
		return false, nil
	}
	return false, fmt.Errorf("kernelprobe: %w", err)
}

func probeError(what string, err error) error {
	if errors.Is(err, unix.EPERM) {
		return fmt.Errorf("kernelprobe: probing %s: %w (needs CAP_BPF and CAP_PERFMON, or root)", what, err)
	}
	return fmt.Errorf("kernelprobe: probing %s: %w", what, err)
}

// nopProgram loads "return 0" as a probe program with the given expected
// attach type. ok is false when the kernel refuses the attach type (E2BIG:
// too old to know the field; EINVAL: does not know the value).
func nopProgram(at ebpf.AttachType) (prog *ebpf.Program, ok bool, err error) {
	prog, err = ebpf.NewProgramWithOptions(&ebpf.ProgramSpec{
		Name:         "multiprobe_feat",
		Type:         ebpf.Kprobe,
		AttachType:   at,
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
		License:      "MIT",
	}, ebpf.ProgramOptions{})
	switch {
	case err == nil:
		return prog, true, nil
	case errors.Is(err, unix.E2BIG), errors.Is(err, unix.EINVAL):
		return nil, false, nil
	}
	return nil, false, err
}

// tryLink asks for a uprobe_multi (or session) link that must fail, and
// returns the kernel's errno. It closes the link and reports an error if the
// kernel unexpectedly creates one.
func tryLink(prog *ebpf.Program, at ebpf.AttachType, path string, pid uint32) (unix.Errno, error) {
	fd, errno := bpfsys.LinkCreateUprobeMulti(bpfsys.UprobeMulti{
		ProgFD:     prog.FD(),
		AttachType: uint32(at),
		Path:       path,
		Offsets:    []uint64{0},
		PID:        pid,
	})
	if errno == 0 {
		unix.Close(fd)
		return 0, fmt.Errorf("kernelprobe: a probe link on %s at offset 0 was created, which the kernel should have refused", path)
	}
	return errno, nil
}

// probeUprobeMulti detects uprobe_multi links (6.6) and the pid-filter fix
// (6.10) with one loaded program.
func probeUprobeMulti() (multi, pidFilter bool, err error) {
	prog, ok, err := nopProgram(ebpf.AttachTraceUprobeMulti)
	if err != nil {
		return false, false, probeError("uprobe_multi", err)
	}
	if !ok {
		return false, false, nil
	}
	defer prog.Close()

	// A directory is not a regular file: EBADF means the kernel parsed the
	// request as a uprobe_multi link; EINVAL means it does not know the
	// attach type.
	errno, err := tryLink(prog, ebpf.AttachTraceUprobeMulti, "/", 0)
	if err != nil {
		return false, false, err
	}
	switch errno {
	case unix.EBADF:
	case unix.EINVAL:
		return false, false, nil
	default:
		return false, false, probeError("uprobe_multi", errno)
	}

	// Linux 6.10 (46ba0e49b642, the pid filter fix) rejects a negative pid
	// up front with EINVAL. Older kernels look the pid up after opening the
	// file and fail with ESRCH. The file must be regular for the lookup to
	// happen, hence our own executable.
	errno, err = tryLink(prog, ebpf.AttachTraceUprobeMulti, "/proc/self/exe", ^uint32(0))
	if err != nil {
		return true, false, err
	}
	switch errno {
	case unix.EINVAL:
		return true, true, nil
	case unix.ESRCH:
		return true, false, nil
	}
	return true, false, probeError("the uprobe_multi pid filter", errno)
}

// probeUprobeSession detects uprobe sessions (6.13): a program loaded with
// the session attach type and a session link on a directory, which fails
// with EBADF where sessions exist and EINVAL where they do not.
func probeUprobeSession() (bool, error) {
	prog, ok, err := nopProgram(AttachTraceUprobeSession)
	if err != nil {
		return false, probeError("uprobe sessions", err)
	}
	if !ok {
		return false, nil
	}
	defer prog.Close()
	errno, err := tryLink(prog, AttachTraceUprobeSession, "/", 0)
	if err != nil {
		return false, err
	}
	switch errno {
	case unix.EBADF:
		return true, nil
	case unix.EINVAL:
		return false, nil
	}
	return false, probeError("uprobe sessions", errno)
}
