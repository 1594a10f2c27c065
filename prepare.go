package multiprobe

import (
	"errors"
	"fmt"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/multiprobe/multiprobe/fallback"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/pidfilter"
	"github.com/multiprobe/multiprobe/usdt"
)

// ErrNoPIDFilter is returned by AttachSites when the options need the
// in-BPF pid filter and the program does not have it: its spec did not go
// through Prepare with those options before it was loaded.
var ErrNoPIDFilter = errors.New("program has no in-BPF pid filter: prepare its spec with multiprobe.Prepare and the same Options before loading")

// Prepare readies cs, before it is loaded, for the attach path the kernel
// supports and for opts, which must be the Options later given to Attach:
//
//   - uprobe programs get the expected attach type of the path
//     (kernelprobe.PrepareCollectionSpec): uprobe_multi on Linux 6.6+,
//     none for per-site perf-event uprobes;
//   - where opts filter by pid and the kernel cannot (the perf-event path,
//     uprobe_multi before the 6.10 fix, or a set of pids), every uprobe
//     program gets the in-BPF filter prologue (package pidfilter);
//   - on kernels without BPF cookies (before 5.15), objects that include
//     bpf/cookie.bpf.h or bpf/usdt.bpf.h are set to find their cookies by
//     the probed address.
func Prepare(cs *ebpf.CollectionSpec, opts *Options) error {
	if opts == nil {
		opts = &Options{}
	}
	f := opts.Features
	if f == nil {
		d, err := kernelprobe.Detect()
		if err != nil {
			return err
		}
		f = &d
	}
	kernelprobe.PrepareCollectionSpec(cs, f.Path())
	if filterPIDs(f, opts) != nil {
		var progs []string
		for name, p := range cs.Programs {
			if isUprobeSpec(p) {
				progs = append(progs, name)
			}
		}
		slices.Sort(progs)
		if len(progs) > 0 {
			if err := pidfilter.Inject(cs, progs...); err != nil {
				return fmt.Errorf("injecting the pid filter: %w", err)
			}
		}
	}
	if !f.Cookies {
		if _, ok := cs.Maps[fallback.CookieMapName]; ok {
			if err := fallback.ConfigureCollection(cs, fallback.CollectionOptions{NoCookie: true}); err != nil {
				return err
			}
		}
		if _, ok := cs.Maps[usdt.SpecMapName]; ok {
			if err := usdt.ConfigureCollection(cs, usdt.CollectionOptions{NoCookie: true}); err != nil {
				return err
			}
		}
	}
	return nil
}

// isUprobeSpec reports whether p is a uprobe program, whichever path it
// was prepared for.
func isUprobeSpec(p *ebpf.ProgramSpec) bool {
	return kernelprobe.AttachType(p, kernelprobe.PathUprobeMulti) == ebpf.AttachTraceUprobeMulti
}

// filterPIDs returns the pids the in-BPF filter must admit, or nil when no
// in-BPF filter is needed: without a pid, or when the kernel's uprobe_multi
// pid filter covers the one pid asked for. Prepare and AttachSites decide
// with it, so they agree.
//
// The kernel's own filter is not used on the perf-event path (a perf
// event's pid names one thread, not a process) nor on uprobe_multi before
// Linux 6.10 (commit 46ba0e49b642), where it also matched one thread only
// and silently dropped the other threads of the process.
func filterPIDs(f *kernelprobe.Features, opts *Options) []int {
	pids := slices.Clone(opts.PIDs)
	if opts.PID != 0 {
		pids = append(pids, opts.PID)
	}
	if len(pids) == 0 {
		return nil
	}
	if len(opts.PIDs) == 0 && f.Path() == kernelprobe.PathUprobeMulti && f.UprobeMultiPIDFilter {
		return nil
	}
	slices.Sort(pids)
	return slices.Compact(pids)
}

// filterBy admits pids through the program's in-BPF filter.
func (l *Link) filterBy(prog *ebpf.Program, opts *Options, pids []int) error {
	m := opts.Maps[pidfilter.MapName]
	if m == nil {
		return fmt.Errorf("program %v: %w", prog, ErrNoPIDFilter)
	}
	f, err := pidfilter.New(m)
	if err != nil {
		return err
	}
	if err := f.Add(pids...); err != nil {
		return err
	}
	l.filter, l.pids = f, pids
	return nil
}

// SetPIDs replaces the processes whose calls the attached program sees,
// while it stays attached. It needs the in-BPF filter: the Link must have
// been made with Options.PIDs (or a PID the kernel could not filter).
func (l *Link) SetPIDs(pids ...int) error {
	if l.filter == nil {
		return fmt.Errorf("SetPIDs: %w (attach with Options.PIDs to filter inside BPF)", ErrNoPIDFilter)
	}
	pids = slices.Clone(pids)
	slices.Sort(pids)
	pids = slices.Compact(pids)
	// Add before removing, so that a pid in both sets is never dropped.
	if err := l.filter.Add(pids...); err != nil {
		return err
	}
	var gone []int
	for _, p := range l.pids {
		if !slices.Contains(pids, p) {
			gone = append(gone, p)
		}
	}
	if err := l.filter.Remove(gone...); err != nil {
		return err
	}
	l.pids = pids
	return nil
}
