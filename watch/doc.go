// Package watch follows a probe spec to the binaries that appear after it
// was resolved: programs installed or upgraded, containers that start with
// their own copy of a library, libraries opened with dlopen. A uprobe
// belongs to one inode, so a process running an already-probed file is
// covered, and a new file is not; watch finds new files from kernel events
// (a program run, an executable mapping) rather than by polling /proc,
// and scans /proc once at start for what runs already.
package watch
