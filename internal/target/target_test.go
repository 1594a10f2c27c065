package target_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/multiprobe/multiprobe/attach"
	"github.com/multiprobe/multiprobe/fallback"
	"github.com/multiprobe/multiprobe/internal/target"
)

// TestUnsupported: every missing-feature error of attach and fallback is
// ebpf.ErrNotSupported to a caller that asks, wrapped or not, and still
// itself, with its own text.
func TestUnsupported(t *testing.T) {
	for _, sentinel := range []error{
		attach.ErrUprobeMultiUnsupported,
		attach.ErrPIDFilterUnsupported,
		attach.ErrSessionUnsupported,
		fallback.ErrRefCtrUnsupported,
	} {
		err := fmt.Errorf("attach: kernel 6.1: %w", sentinel)
		if !errors.Is(err, ebpf.ErrNotSupported) || !errors.Is(err, sentinel) {
			t.Errorf("%v: errors.Is ErrNotSupported %v, itself %v", sentinel, errors.Is(err, ebpf.ErrNotSupported), errors.Is(err, sentinel))
		}
		if errors.Is(err, attach.ErrInvalidOptions) {
			t.Errorf("%v is ErrInvalidOptions", sentinel)
		}
	}
	if attach.ErrSessionUnsupported.Error() != "kernel has no uprobe sessions (Linux 6.13+)" || errors.Is(attach.ErrSessionUnsupported, attach.ErrUprobeMultiUnsupported) {
		t.Errorf("sentinels are not apart: %v", attach.ErrSessionUnsupported)
	}
}

// TestClone: a clone of targets shares no slice with them.
func TestClone(t *testing.T) {
	ts := target.Targets{{Path: "/bin/x", Offsets: []uint64{1, 2}, RefCtrOffsets: []uint64{0, 8}, Cookies: []uint64{5, 6}, Names: []string{"a", "b"}}}
	c := ts.Clone()
	c[0].Offsets[0], c[0].RefCtrOffsets[1], c[0].Cookies[0], c[0].Names[0], c[0].Path = 9, 9, 9, "z", "/bin/y"
	if ts[0].Offsets[0] != 1 || ts[0].RefCtrOffsets[1] != 8 || ts[0].Cookies[0] != 5 || ts[0].Names[0] != "a" || ts[0].Path != "/bin/x" {
		t.Errorf("changing the clone changed the targets: %+v", ts[0])
	}
}
