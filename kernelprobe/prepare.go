package kernelprobe

import (
	"strings"

	"github.com/cilium/ebpf"
)

// PrepareProgramSpec sets the expected attach type of a uprobe program for
// path p, before it is loaded: ebpf.AttachTraceUprobeMulti for
// [PathUprobeMulti], none for [PathPerfEvent]. The kernel refuses to attach
// a program loaded for one path through the other (checked on 6.18), so the
// same object file serves both paths only if this runs before every load.
//
// A uprobe program is one of type ebpf.Kprobe whose section name starts with
// "uprobe", "uretprobe" or "usdt" (libbpf's conventions, including
// "uprobe.multi" and the sleepable ".s" forms) or whose attach type already
// is AttachTraceUprobeMulti. Other programs, and uprobe session programs
// (section "uprobe.session", or attach type [AttachTraceUprobeSession]),
// which exist only on the uprobe_multi path, are left alone, as is
// everything when spec is nil or p is neither path.
func PrepareProgramSpec(spec *ebpf.ProgramSpec, p Path) {
	if spec != nil {
		spec.AttachType = AttachType(spec, p)
	}
}

// AttachType returns the expected attach type that spec must be loaded with
// for path p, without changing spec: what PrepareProgramSpec would set. A
// loader that must not write the caller's specs uses it on its copies.
func AttachType(spec *ebpf.ProgramSpec, p Path) ebpf.AttachType {
	if spec == nil {
		return ebpf.AttachNone
	}
	if !isUprobe(spec) {
		return spec.AttachType
	}
	switch p {
	case PathUprobeMulti:
		return ebpf.AttachTraceUprobeMulti
	case PathPerfEvent:
		return ebpf.AttachNone
	}
	return spec.AttachType
}

// PrepareCollectionSpec applies [PrepareProgramSpec] to every program of cs.
func PrepareCollectionSpec(cs *ebpf.CollectionSpec, p Path) {
	if cs == nil {
		return
	}
	for _, spec := range cs.Programs {
		PrepareProgramSpec(spec, p)
	}
}

func isUprobe(spec *ebpf.ProgramSpec) bool {
	if spec.Type != ebpf.Kprobe || spec.AttachType == AttachTraceUprobeSession {
		return false
	}
	if spec.AttachType == ebpf.AttachTraceUprobeMulti {
		return true
	}
	sec := spec.SectionName
	if strings.HasPrefix(sec, "uprobe.session") {
		return false
	}
	for _, prefix := range []string{"uprobe", "uretprobe", "usdt"} {
		if sec == prefix || strings.HasPrefix(sec, prefix+".") || strings.HasPrefix(sec, prefix+"/") {
			return true
		}
	}
	return false
}
