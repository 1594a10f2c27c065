package kernelprobe_test

import (
	"errors"
	"runtime"
	"testing"

	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/probetest"
	"golang.org/x/sys/unix"
)

// TestDetectRetriesAfterEPERM probes with the thread's effective
// capabilities dropped (the kernel says EPERM), then with them back: an
// EPERM says nothing of the kernel, so the second Detect probes again and
// finds what a fresh detection finds, instead of the first one's error.
func TestDetectRetriesAfterEPERM(t *testing.T) {
	probetest.RequireBPF(t)
	t.Setenv(kernelprobe.ForceEnv, "")
	kernelprobe.ResetForTest()
	t.Cleanup(kernelprobe.ResetForTest)

	// Capabilities are per thread, and Detect's probes are system calls
	// made on the calling goroutine's thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var saved [2]unix.CapUserData
	if err := unix.Capget(&hdr, &saved[0]); err != nil {
		t.Fatal(err)
	}
	dropped := saved
	dropped[0].Effective, dropped[1].Effective = 0, 0
	if err := unix.Capset(&hdr, &dropped[0]); err != nil {
		t.Fatal(err)
	}
	_, err := kernelprobe.Detect()
	if err := unix.Capset(&hdr, &saved[0]); err != nil {
		t.Fatal(err) // the thread is locked: it dies with the test
	}
	if !errors.Is(err, unix.EPERM) {
		t.Fatalf("Detect without capabilities: %v, want EPERM", err)
	}
	f, err := kernelprobe.Detect()
	if err != nil {
		t.Fatalf("Detect with the capabilities back: %v", err)
	}
	kernelprobe.ResetForTest()
	fresh, err := kernelprobe.Detect()
	if err != nil || f != fresh {
		t.Errorf("after an EPERM: %+v; a fresh detection: %+v, %v", f, fresh, err)
	}
}
