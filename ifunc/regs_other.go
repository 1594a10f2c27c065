//go:build linux && !amd64 && !arm64

package ifunc

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// breakpoint is empty where ifunc has no way to call a resolver: resolve
// refuses before it starts a helper, and the sites keep their resolvers,
// each saying why. A container's IFUNCs are still read from its process
// (ResolveIn), which calls nothing.
var breakpoint []byte

func call(int, *unix.PtraceRegs, uint64, uint64) (uint64, error) {
	return 0, fmt.Errorf("%w: calling a resolver on %s", ErrUnsupported, runtime.GOARCH)
}
