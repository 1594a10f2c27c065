package target_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/multiprobe/multiprobe/attach"
	"github.com/multiprobe/multiprobe/fallback"
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
