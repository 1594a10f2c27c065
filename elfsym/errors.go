package elfsym

import (
	"errors"
	"fmt"
	"strings"

	"github.com/multiprobe/multiprobe/internal/elfimage"
	"github.com/multiprobe/multiprobe/internal/fds"
	"github.com/multiprobe/multiprobe/internal/glob"
)

var (
	// ErrNotELF is returned for a file that is not an ELF file at all.
	ErrNotELF = elfimage.ErrNotELF
	// ErrUnsupported is returned for an ELF file of a kind elfsym does not
	// read: 32-bit, big-endian, or not an executable or shared object.
	ErrUnsupported = errors.New("unsupported ELF file")
	// ErrMalformed is returned for an ELF file whose headers or tables point
	// outside the file or contradict each other, such as a truncated file.
	ErrMalformed = errors.New("malformed ELF file")
	// ErrNoMatch is returned when the patterns select no site. The error is
	// a *NoMatchError with suggestions.
	ErrNoMatch = errors.New("no symbol matches")
	// ErrAmbiguous is returned when an exact name (a pattern without glob
	// characters) names two non-weak definitions at different addresses.
	// The error is an *AmbiguousError.
	ErrAmbiguous = errors.New("ambiguous symbol")
	// ErrBadPattern is returned for a malformed pattern: an unclosed '[',
	// an empty pattern or version, only exclusions. It is the error of the
	// glob matcher that elfsym and usdt share.
	ErrBadPattern = glob.ErrBadPattern
	// ErrNotFound is returned when a bare library or program name is found
	// neither through the dynamic loader's cache and directories nor in
	// $PATH. It wraps fs.ErrNotExist too.
	ErrNotFound = errors.New("not found")
	// ErrNotRegular: the path is a FIFO, a device or a directory, which
	// multiprobe never opens for reading (a FIFO would block it, a device
	// feed it without end).
	ErrNotRegular = fds.ErrNotRegular
)

// NoMatchError reports patterns that selected nothing.
type NoMatchError struct {
	Path        string   // the file searched
	Patterns    []string // the patterns as given
	Searched    int      // how many function symbols were searched
	Suggestions []string // the closest names, best first, at most a few
	// Stripped reports that the file has no .symtab (nor a Go
	// .gopclntab): only the functions its .dynsym exports, if any, were
	// searched. Otherwise Searched == 0 means tables without functions,
	// as in a data-only library.
	Stripped bool
}

// Error names the file, the patterns, how many symbols were searched and
// the closest names.
func (e *NoMatchError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: no function matches %s among %d function symbols",
		e.Path, strings.Join(quoteAll(e.Patterns), ", "), e.Searched)
	if len(e.Suggestions) > 0 {
		fmt.Fprintf(&b, " (closest: %s)", strings.Join(e.Suggestions, ", "))
	}
	switch {
	case e.Stripped && e.Searched == 0:
		b.WriteString(" (the file is stripped: it has no .symtab, and its .dynsym, if any, exports no function)")
	case e.Stripped:
		// Debian's binaries are: a static function is in the debug
		// file, which multiprobe does not read.
		b.WriteString(" (the file is stripped: only the functions its .dynsym exports were searched)")
	case e.Searched == 0:
		b.WriteString(" (its symbol tables name no functions: a data-only file?)")
	}
	return b.String()
}

// Is lets errors.Is(err, ErrNoMatch) match.
func (e *NoMatchError) Is(target error) bool { return target == ErrNoMatch }

// AmbiguousError reports an exact name defined at several addresses.
type AmbiguousError struct {
	Path string
	Name string
	// Sites are the competing definitions, by offset.
	Sites []Site
}

// Error lists every definition of the name.
func (e *AmbiguousError) Error() string {
	var defs []string
	for _, s := range e.Sites {
		defs = append(defs, fmt.Sprintf("%s %s at offset %#x", bindName(s.Bind), s.Name, s.Offset))
	}
	return fmt.Sprintf("%s: %q is defined %d times (%s): use a glob to select them all, or name the file offset",
		e.Path, e.Name, len(e.Sites), strings.Join(defs, "; "))
}

// Is lets errors.Is(err, ErrAmbiguous) match.
func (e *AmbiguousError) Is(target error) bool { return target == ErrAmbiguous }

func quoteAll(ss []string) []string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = fmt.Sprintf("%q", s)
	}
	return q
}
