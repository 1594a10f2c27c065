package load

import (
	"errors"
	"fmt"
	"strings"
	"syscall"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

var (
	// ErrTailCallMix is wrapped by a [*TailCallMixError]: programs sharing a
	// tail-call map (PROG_ARRAY) would load with different program types
	// or, where the kernel requires it (Linux 6.12, and stable kernels with
	// the fix), different expected attach types.
	ErrTailCallMix = errors.New("programs sharing a tail-call map need one program type and expected attach type")

	// ErrAfterVerification is wrapped by the [ProgramError] of a program the
	// verifier accepted but the kernel then refused to load.
	ErrAfterVerification = errors.New("the verifier accepted the program but the kernel refused it")

	// ErrUnsafeCostCache is wrapped by the error of a cost cache whose file
	// or directory another user could have placed or could change: a
	// symlink, a device, FIFO or other non-regular file, a file too large
	// to be a cache, or a directory not owned by the current user (or root)
	// or writable by group or others.
	ErrUnsafeCostCache = errors.New("cost cache path is not safe to use")

	// ErrNoCostCache is returned for [OrderCached] without [Options.Costs].
	ErrNoCostCache = errors.New("order cached needs a cost cache (Options.Costs)")
)

// ProgramError is the failure of one program's load.
type ProgramError struct {
	// Program is the name of the program that failed.
	Program string
	// Err is what the load returned; a rejection by the verifier wraps an
	// [ebpf.VerifierError] whose Log holds the verifier's message (and, for
	// the first rejection of a phase, its whole log). A program refused
	// after verification wraps [ErrAfterVerification].
	Err error

	// Rejected tells that the verifier rejected the program.
	Rejected bool
	// AfterVerification tells that the verifier accepted the program (its
	// log holds only statistics) and the kernel refused it afterwards,
	// typically with EINVAL.
	AfterVerification bool
	// Causes lists, for a program refused after verification, what the
	// loader checked that may explain it, most likely first.
	Causes []string

	msg     string // Err's text without cilium's "program NAME: " prefix
	fullLog bool   // Err holds the whole verifier log
}

func newProgramError(name string, err error) *ProgramError {
	// ebpf.NewCollectionWithOptions already prefixes the program's name;
	// drop it so that the name appears once.
	msg := strings.TrimPrefix(err.Error(), "program "+name+": ")
	if errors.Is(err, unix.EPERM) {
		msg = permissionMessage(msg)
	}
	return &ProgramError{Program: name, Err: err, msg: msg}
}

// permissionMessage replaces the hint cilium/ebpf gives for every EPERM,
// the memlock rlimit, which since Linux 5.11 is never the cause (BPF
// memory is charged to the memory cgroup), with what is missing.
func permissionMessage(msg string) string {
	msg, _, _ = strings.Cut(msg, " (MEMLOCK may be too low")
	return msg + " (loading needs CAP_BPF, and CAP_PERFMON for tracing programs, or root)"
}

// withoutMemlockHint is err with permissionMessage's text where it is an
// EPERM; it still wraps err.
func withoutMemlockHint(err error) error {
	if !errors.Is(err, unix.EPERM) {
		return err
	}
	return &permError{msg: permissionMessage(err.Error()), err: err}
}

type permError struct {
	msg string
	err error
}

func (e *permError) Error() string { return e.msg }
func (e *permError) Unwrap() error { return e.err }

// Error names the program and says why it failed: for a verifier rejection
// with the verifier's last lines but not its whole log, for a program
// refused after verification with the errno and the likely causes.
func (e *ProgramError) Error() string {
	if e.AfterVerification {
		var b strings.Builder
		fmt.Fprintf(&b, "program %s: %v", e.Program, ErrAfterVerification)
		if s := e.stats(); s != "" {
			fmt.Fprintf(&b, " (%s)", s)
		}
		var errno syscall.Errno
		if errors.As(e.Err, &errno) {
			fmt.Fprintf(&b, " with %s (%v)", errnoName(errno), errno)
		}
		if len(e.Causes) > 0 {
			b.WriteString("; likely causes: ")
			b.WriteString(strings.Join(e.Causes, "; "))
		}
		return b.String()
	}
	msg := e.msg
	if msg == "" && e.Err != nil {
		msg = e.Err.Error()
	}
	if e.Rejected {
		if m := e.verifierMessage(); m != "" {
			msg = m
		}
		return fmt.Sprintf("program %s: rejected by the verifier: %s", e.Program, msg)
	}
	return fmt.Sprintf("program %s: %s", e.Program, msg)
}

// verifierMessage returns the verifier's reason for a rejection, its last
// line before the statistics, and the errno: "R0 !read_ok (EACCES)".
func (e *ProgramError) verifierMessage() string {
	var ve *ebpf.VerifierError
	if !errors.As(e.Err, &ve) {
		return ""
	}
	var last string
	for _, line := range ve.Log {
		if !isStatsLine(line) && strings.TrimSpace(line) != "" {
			last = strings.TrimSpace(line)
		}
	}
	if last == "" {
		return ""
	}
	var errno syscall.Errno
	if errors.As(e.Err, &errno) {
		last += " (" + errnoName(errno) + ")"
	}
	return last
}

// stats returns the verifier's "processed N insns" line, shortened.
func (e *ProgramError) stats() string {
	var ve *ebpf.VerifierError
	if !errors.As(e.Err, &ve) {
		return ""
	}
	for _, line := range ve.Log {
		if strings.HasPrefix(line, "processed ") {
			s, _, _ := strings.Cut(line, " (limit")
			return "verifier: " + s
		}
	}
	return ""
}

func errnoName(e syscall.Errno) string {
	if name := unix.ErrnoName(e); name != "" {
		return name
	}
	if e == 524 {
		return "ENOTSUPP" // the kernel's own, unknown to libc
	}
	return fmt.Sprintf("errno %d", int(e))
}

// Unwrap returns the load's error.
func (e *ProgramError) Unwrap() error {
	if e.AfterVerification {
		return errors.Join(ErrAfterVerification, e.Err)
	}
	return e.Err
}

// VerifierLog returns the verifier log of a rejection: the whole log for
// the first rejection of a phase (and those named in
// [Options.VerifierLogs]), the verifier's message and statistics for the
// others; nil if the verifier did not reject the program.
func (e *ProgramError) VerifierLog() []string {
	var ve *ebpf.VerifierError
	if e.Rejected && errors.As(e.Err, &ve) {
		return ve.Log
	}
	return nil
}

// Error reports the programs that failed to load, in job order.
//
// Its text names every failed program on one line each; the first verifier
// rejection is followed by its whole verifier log, the others show only the
// verifier's last lines, so that a report stays readable (and a failing
// start fast) when many programs share a cause. errors.Is and errors.As see
// every [ProgramError].
type Error struct {
	// Failures holds one error per failed program, in job order.
	Failures []*ProgramError
	// Programs is the number of programs the phase tried to load.
	Programs int

	withoutLog []string // rejected programs whose whole log was not fetched
}

// Error lists the failures, one per line, the first rejection with its
// whole verifier log, and says how to get the others'.
func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d of %d programs failed to load", len(e.Failures), e.Programs)
	logged := false
	for _, f := range e.Failures {
		b.WriteString("\n")
		b.WriteString(f.Error())
		if logged || !f.fullLog {
			continue
		}
		if log := f.VerifierLog(); len(log) > 0 {
			logged = true
			b.WriteString("\nverifier log of program " + f.Program + ":")
			for _, line := range log {
				// The one line that changes from run to run; the profile
				// has the time.
				if strings.HasPrefix(line, "verification time ") {
					continue
				}
				b.WriteString("\n\t")
				b.WriteString(line)
			}
		}
	}
	if len(e.withoutLog) > 0 {
		fmt.Fprintf(&b, "\nwhole verifier logs of %s: add them to load.Options.VerifierLogs (each is verified once more with the log)", strings.Join(e.withoutLog, ", "))
	}
	return b.String()
}

// Unwrap returns the failures, for errors.Is and errors.As.
func (e *Error) Unwrap() []error {
	errs := make([]error, len(e.Failures))
	for i, f := range e.Failures {
		errs[i] = f
	}
	return errs
}
