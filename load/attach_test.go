package load

import (
	"testing"

	"github.com/cilium/ebpf"

	"github.com/multiprobe/multiprobe/kernelprobe"
)

func TestUprobeAttachType(t *testing.T) {
	up := &ebpf.ProgramSpec{Type: ebpf.Kprobe, SectionName: "uprobe"}
	kp := &ebpf.ProgramSpec{Type: ebpf.Kprobe, SectionName: "kprobe/x", AttachType: ebpf.AttachNone}
	for _, tt := range []struct {
		path kernelprobe.Path
		want ebpf.AttachType
	}{
		{kernelprobe.PathUprobeMulti, ebpf.AttachTraceUprobeMulti},
		{kernelprobe.PathPerfEvent, ebpf.AttachNone},
	} {
		hook := UprobeAttachType(tt.path)
		if got := hook("up", up); got != tt.want {
			t.Errorf("%v: uprobe gets %v, want %v", tt.path, got, tt.want)
		}
		if got := hook("kp", kp); got != ebpf.AttachNone {
			t.Errorf("%v: kprobe gets %v", tt.path, got)
		}
	}
}

func TestCheckTailCallGroups(t *testing.T) {
	spec := tailCallSpec(ebpf.AttachNone)
	mk := func(callerAt, calleeAt ebpf.AttachType) []*job {
		return []*job{
			{index: 0, name: "callee", orig: spec.Programs["callee"], attach: calleeAt},
			{index: 1, name: "caller", orig: spec.Programs["caller"], attach: callerAt},
		}
	}
	arrays := map[string][]string{"jmp": {"callee"}}
	if err := checkTailCallGroups(mk(ebpf.AttachNone, ebpf.AttachNone), arrays); err != nil {
		t.Errorf("same types: %v", err)
	}
	if err := checkTailCallGroups(mk(ebpf.AttachTraceUprobeMulti, ebpf.AttachNone), arrays); err == nil {
		t.Error("caller and callee (by contents) mixed: no error")
	}
	// Without contents, only references group programs.
	if err := checkTailCallGroups(mk(ebpf.AttachTraceUprobeMulti, ebpf.AttachNone), map[string][]string{"jmp": nil}); err != nil {
		t.Errorf("callee not in the map: %v", err)
	}
}

func TestParseOrder(t *testing.T) {
	for _, o := range []Order{OrderLPT, OrderGiven, OrderCached} {
		got, err := ParseOrder(o.String())
		if err != nil || got != o {
			t.Errorf("ParseOrder(%q) = %v, %v", o, got, err)
		}
	}
	if _, err := ParseOrder("fifo"); err == nil {
		t.Error("ParseOrder(fifo) succeeded")
	}
}
