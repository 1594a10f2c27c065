package main

import "golang.org/x/sys/unix"

// ioctlReadTermios is the ioctl that reads a terminal's settings.
const ioctlReadTermios = unix.TCGETS

// pidfdOpen opens a pidfd (Linux 5.3+) for process pid.
func pidfdOpen(pid int) (int, error) { return unix.PidfdOpen(pid, 0) }
