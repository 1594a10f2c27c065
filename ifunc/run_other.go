//go:build !linux

package ifunc

import (
	"debug/elf"
	"fmt"
	"os"
	"runtime"
)

// breakpoint is empty outside Linux: resolve refuses before it starts a
// helper, as on an architecture it has no calls for.
var breakpoint []byte

func runResolvers(path string, _ *os.File, _ *elf.File, _ string, _ fileID, _ []uint64) ([]uint64, []error, error) {
	return nil, nil, fmt.Errorf("ifunc: %s: %w: running resolvers needs Linux's ptrace, not %s's", path, ErrUnsupported, runtime.GOOS)
}
