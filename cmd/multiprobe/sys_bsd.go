//go:build darwin || dragonfly || freebsd || netbsd || openbsd

package main

import "golang.org/x/sys/unix"

// ioctlReadTermios is the ioctl that reads a terminal's settings.
const ioctlReadTermios = unix.TIOCGETA

// pidfdOpen fails: there are no pidfds here, and processExit polls.
func pidfdOpen(int) (int, error) { return -1, unix.ENOSYS }
