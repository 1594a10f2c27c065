package load

import (
	"errors"
	"fmt"
	"strings"

	"github.com/cilium/ebpf"
)

var (
	// ErrAttachTypeMix is returned when programs that share a tail-call map
	// (PROG_ARRAY) would be loaded with different expected attach types.
	ErrAttachTypeMix = errors.New("programs sharing a tail-call map need one expected attach type")

	// ErrNoCostCache is returned for [OrderCached] without [Options.Costs].
	ErrNoCostCache = errors.New("order cached needs a cost cache (Options.Costs)")
)

// ProgramError is the failure of one program's load.
type ProgramError struct {
	// Program is the name of the program that failed.
	Program string
	// Err is what the load returned; a rejection by the verifier wraps an
	// [ebpf.VerifierError] whose Log holds the whole verifier log.
	Err error

	msg string // Err's text without cilium's "program NAME: " prefix
}

func newProgramError(name string, err error) *ProgramError {
	// ebpf.NewCollectionWithOptions already prefixes the program's name;
	// drop it so that the name appears once.
	msg := strings.TrimPrefix(err.Error(), "program "+name+": ")
	return &ProgramError{Program: name, Err: err, msg: msg}
}

// Error names the program and says why it failed, with the verifier's last
// lines but not its whole log.
func (e *ProgramError) Error() string {
	msg := e.msg
	if msg == "" && e.Err != nil {
		msg = e.Err.Error()
	}
	return fmt.Sprintf("program %s: %s", e.Program, msg)
}

// Unwrap returns the load's error.
func (e *ProgramError) Unwrap() error { return e.Err }

// VerifierLog returns the whole verifier log of the failure, or nil if the
// load failed before the verifier ran.
func (e *ProgramError) VerifierLog() []string {
	var ve *ebpf.VerifierError
	if errors.As(e.Err, &ve) {
		return ve.Log
	}
	return nil
}

// Error reports the programs that failed to load, in job order.
//
// Its text names every failed program on one line each; the first failure is
// followed by its whole verifier log, the others show only the verifier's
// last lines, so that a report stays readable when many programs share a
// cause. errors.Is and errors.As see every [ProgramError].
type Error struct {
	// Failures holds one error per failed program, in job order.
	Failures []*ProgramError
	// Programs is the number of programs the phase tried to load.
	Programs int
}

// Error lists the failures, one per line, the first with its whole verifier
// log.
func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d of %d programs failed to load", len(e.Failures), e.Programs)
	for i, f := range e.Failures {
		b.WriteString("\n")
		b.WriteString(f.Error())
		if i > 0 {
			continue
		}
		if log := f.VerifierLog(); len(log) > 0 {
			b.WriteString("\nverifier log of program " + f.Program + ":")
			for _, line := range log {
				b.WriteString("\n\t")
				b.WriteString(line)
			}
		}
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
