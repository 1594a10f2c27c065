// Package procmaps reads /proc/PID/maps, the memory map of a process, and
// turns file offsets of a binary into the addresses a process sees them at.
// elfsym lists a process's executable files with it; the attach paths use
// it where the kernel gives BPF no cookie and a probed address must stand
// for the site.
package procmaps
