package load

import (
	"testing"

	"github.com/cilium/ebpf"
)

func TestIsUprobe(t *testing.T) {
	tests := []struct {
		spec *ebpf.ProgramSpec
		want bool
	}{
		{&ebpf.ProgramSpec{Type: ebpf.Kprobe, SectionName: "uprobe/libc.so:malloc"}, true},
		{&ebpf.ProgramSpec{Type: ebpf.Kprobe, SectionName: "uretprobe"}, true},
		{&ebpf.ProgramSpec{Type: ebpf.Kprobe, SectionName: "uprobe.multi/x"}, true},
		{&ebpf.ProgramSpec{Type: ebpf.Kprobe, SectionName: "usdt/python:function__entry"}, true},
		{&ebpf.ProgramSpec{Type: ebpf.Kprobe, SectionName: "kprobe/do_nanosleep"}, false},
		{&ebpf.ProgramSpec{Type: ebpf.Kprobe, AttachType: ebpf.AttachTraceUprobeMulti}, true},
		{&ebpf.ProgramSpec{Type: ebpf.SocketFilter, SectionName: "uprobe"}, false},
		{nil, false},
	}
	for _, tt := range tests {
		if got := IsUprobe(tt.spec); got != tt.want {
			t.Errorf("IsUprobe(%+v) = %v, want %v", tt.spec, got, tt.want)
		}
	}
}

func TestUprobeAttachType(t *testing.T) {
	hook := UprobeAttachType(ebpf.AttachTraceUprobeMulti)
	up := &ebpf.ProgramSpec{Type: ebpf.Kprobe, SectionName: "uprobe"}
	kp := &ebpf.ProgramSpec{Type: ebpf.Kprobe, SectionName: "kprobe/x", AttachType: ebpf.AttachNone}
	if got := hook("up", up); got != ebpf.AttachTraceUprobeMulti {
		t.Errorf("uprobe gets %v", got)
	}
	if got := hook("kp", kp); got != ebpf.AttachNone {
		t.Errorf("kprobe gets %v", got)
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
