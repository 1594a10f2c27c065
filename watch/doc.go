// Package watch follows probe specs to every file on the node that their
// targets mean, now and as they appear: programs installed or upgraded,
// containers that start with their own copy of a library (another mount
// namespace, another inode), libraries opened with dlopen. A uprobe
// belongs to one inode, so a process running an already-probed file is
// covered, and a new file is not. A Watch finds new files from kernel
// events (a program run, an executable mapping: BPF programs on raw
// tracepoints) rather than by polling /proc, which it scans once at start
// for what runs already; the files its targets name here it attaches at
// once.
//
// A file is the inode the kernel maps, where a uprobe goes: behind an
// overlay, the layer's file, so containers of one image share one link and
// count each call once (Linux 6.1+ says so through a task_vma iterator;
// before, /proc/PID/maps does). Copies of one build (GNU build ID) are
// resolved once and share their cookies; each build has a cookie range of
// its own. A file is detached when its last process has exited and it was
// unlinked. With Options.PinDir the links outlive the process, for the
// next Watch to take back: an agent restarts without missing a call.
//
// Files are attached by a few workers off the event goroutine, so a slow
// file holds back no other, and within budgets (Options.MaxFiles,
// Options.MaxFDs) of which no one user or container may take more than
// its share: a user who maps thousands of matching files gets a few
// attached, and everyone else's files still are, in their usual time.
//
// The events cost every system call on the node the run of two raw
// tracepoint programs that return at once for all but mmap: 27 ns on the
// project's test machine (BenchmarkSyscall), and a file is attached about
// a millisecond after its first mapping (BenchmarkFirstMapping).
package watch
