package load

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

// diagnose lists what may explain why the kernel refused j after its
// verification passed, from what the loader can check: the owner of each
// tail-call map it calls through, its attach target, its BTF.
func diagnose(j *job, maps map[string]*ebpf.Map) []string {
	var causes, weak []string
	var arrays []string
	for i := range j.orig.Instructions {
		ins := &j.orig.Instructions[i]
		ref := ins.Reference()
		if !ins.IsLoadFromMap() || ref == "" {
			continue
		}
		if r, ok := j.rename[ref]; ok {
			ref = r
		}
		if m := maps[ref]; m != nil && m.Type() == ebpf.ProgramArray && !slices.Contains(arrays, ref) {
			arrays = append(arrays, ref)
		}
	}
	for _, name := range arrays {
		owner, ok := progArrayOwner(maps[name])
		switch {
		case ok && owner != j.orig.Type:
			causes = append(causes, fmt.Sprintf("tail-call map %s belongs to %s programs (the type of its first user), and this program is %s: give it a tail-call map of its own", name, owner, j.orig.Type))
		case ok:
			weak = append(weak, fmt.Sprintf("tail-call map %s belongs to %s programs like this one, but its first user may have had another expected attach type than this program's %s (kernels from Linux 6.12, and stable ones with its fix, require one; the kernel does not show it): load every program that calls through %s with one attach type", name, owner, attachName(j.attach), name))
		default:
			weak = append(weak, fmt.Sprintf("tail-call map %s: its owner could not be read (%s)", name, "/proc/self/fdinfo"))
		}
	}
	if j.orig.AttachTo != "" || j.orig.AttachTarget != nil {
		target := j.orig.AttachTo
		if target == "" {
			target = "a BPF program"
		}
		weak = append(weak, fmt.Sprintf("attach target %s: the kernel may refuse it for a %s program with attach type %s", target, j.orig.Type, attachName(j.attach)))
	}
	if len(j.orig.Instructions) > 0 && btf.FuncMetadata(&j.orig.Instructions[0]) != nil {
		weak = append(weak, "BTF: the program carries function and line information, which the kernel may refuse (for example BTF from a newer compiler than the kernel knows)")
	}
	causes = append(causes, weak...)
	if len(causes) == 0 {
		causes = append(causes, "none of the loader's checks (tail-call map owners, attach target, BTF) explains it: see the kernel log (dmesg)")
	}
	return causes
}

// progArrayOwner returns the program type the kernel recorded for tail-call
// map m, from the owner_prog_type line of its fdinfo.
func progArrayOwner(m *ebpf.Map) (ebpf.ProgramType, bool) {
	f, err := os.Open("/proc/self/fdinfo/" + strconv.Itoa(m.FD()))
	if err != nil {
		return 0, false
	}
	defer f.Close()
	// fdinfo is a few hundred bytes; never read more than a page.
	sc := bufio.NewScanner(io.LimitReader(f, 4096))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && k == "owner_prog_type" {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
			if err != nil {
				return 0, false
			}
			return ebpf.ProgramType(n), true
		}
	}
	return 0, false
}
