// Command vmtest prebuilds the C targets of package testprogs for a test
// run on a machine without gcc, such as the Linux 6.1 guest that
// .ci/oldkernel/run boots in QEMU.
//
// Usage:
//
//	go run ./internal/vmtest -o DIR N...
//
// For every N it builds (or finds in the host's cache) the target with N
// functions, as [testprogs.Target] does, and copies it into DIR at the place
// where a test process with MULTIPROBE_CACHE_DIR=DIR looks for it. The
// host's cache is $MULTIPROBE_CACHE_DIR if set, else the directory the tests
// use by default, so targets the host tests built are reused.
package main
