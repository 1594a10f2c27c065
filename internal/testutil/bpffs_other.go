//go:build !linux

package testutil

import "testing"

// BPFFS fails the test: there is no BPF filesystem outside Linux.
func BPFFS(tb testing.TB) string {
	tb.Helper()
	tb.Fatal("no BPF filesystem outside Linux")
	return ""
}
