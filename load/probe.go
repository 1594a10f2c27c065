package load

import (
	"errors"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"
)

// tailCallAttachTypes reports whether the running kernel requires the
// programs of one PROG_ARRAY to share their expected attach type. Linux
// 6.12 added the rule (commit 28ead3eaabc1), and stable kernels carry it
// back: Debian's 6.1.0-50 refuses a mix, its 5.10.0-32 takes one. So it is
// probed, not read from the release: two kprobe programs that differ only
// in their expected attach type go into one prog array, and the kernel
// refuses the second with EINVAL where the rule holds. A probe that fails
// otherwise counts as the rule holding: refusing a mix that would have
// loaded is better than loading a mix whose tail calls then fail.
var tailCallAttachTypes = sync.OnceValue(func() bool {
	holds, err := probeTailCallAttachTypes()
	return err != nil || holds
})

func probeTailCallAttachTypes() (bool, error) {
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.ProgramArray, KeySize: 4, ValueSize: 4, MaxEntries: 2})
	if err != nil {
		return false, err
	}
	defer m.Close()
	for i, at := range []ebpf.AttachType{ebpf.AttachNone, ebpf.AttachTraceUprobeMulti} {
		p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
			Type:         ebpf.Kprobe,
			AttachType:   at,
			License:      "GPL",
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
		})
		if err != nil {
			return false, err
		}
		err = m.Update(uint32(i), p, ebpf.UpdateAny)
		p.Close()
		if i == 1 && errors.Is(err, unix.EINVAL) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
	}
	return false, nil
}
