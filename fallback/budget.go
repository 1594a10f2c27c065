package fallback

import "github.com/multiprobe/multiprobe/internal/fds"

// ErrFDBudget: the sites need more file descriptors than RLIMIT_NOFILE's
// hard limit allows. The root package's Plan.Attach returns it too, for
// the clones of a kernel without BPF cookies.
var ErrFDBudget = fds.ErrBudget
