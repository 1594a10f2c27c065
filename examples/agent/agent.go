package main

import (
	"bytes"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"runtime"
	"sync"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/watch"
)

// maxFuncs is bpf/agent.bpf.c's MAX_FUNCS: the functions it has counts
// and histograms for.
const maxFuncs = 4096

// fnName is bpf/agent.bpf.c's struct fn_name, "probe\x00function", in
// bytes rather than bpf2go's int8s.
type fnName struct {
	Name [256]byte
}

// function is what the metrics of one function carry.
type function struct {
	probe, name string
}

// agent is the loaded probe program, its watch, and the functions it
// counts, by number.
type agent struct {
	objs    agentObjects
	w       *watch.Watch
	probes  map[string]string // probe spec (as Probe.String gives it) -> config name
	names   map[string]bool   // the config's probe names
	verbose bool
	cgroups cgroups // names the cgroups the program counts by

	mu  sync.Mutex
	fns []function       // by number
	fn  map[function]int // number by function
}

// start loads the program with its counts pinned under cfg.PinDir, takes
// back the function numbers pinned there, and starts the watch.
func start(cfg *config, verbose bool) (_ *agent, err error) {
	a := &agent{probes: map[string]string{}, names: map[string]bool{}, fn: map[function]int{}, verbose: verbose}
	var probes []multiprobe.Probe
	for _, pc := range cfg.Probes {
		a.names[pc.Name] = true
		ps, err := multiprobe.ParseProbes(pc.Spec)
		if err != nil {
			return nil, err // config.check said so first
		}
		for _, p := range ps {
			// An entry and a return probe each: the time between is the
			// call's.
			ret := p
			ret.Kind = multiprobe.Return
			probes = append(probes, p, ret)
			a.probes[p.String()], a.probes[ret.String()] = pc.Name, pc.Name
		}
	}
	spec, err := loadAgent()
	if err != nil {
		return nil, err
	}
	// Updatable: a restart with another config, or an upgrade, changes
	// the links taken back from the pins in place (watch.Updated), with
	// no call missed or counted twice.
	opts := multiprobe.Options{Updatable: true}
	if err := multiprobe.PrepareSpec(spec, &opts); err != nil {
		return nil, err
	}
	for _, m := range []string{"counts", "hists", "fn_names", "cgroup_counts", "other_counts", "overflow"} {
		spec.Maps[m].Pinning = ebpf.PinByName
	}
	if err := pinDir(cfg.PinDir); err != nil {
		return nil, err
	}
	if err := spec.LoadAndAssign(&a.objs, &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: cfg.PinDir}}); err != nil {
		return nil, fmt.Errorf("loading the probe program (pinned under %s): %w", cfg.PinDir, err)
	}
	defer func() {
		if err != nil {
			a.objs.Close()
		}
	}()
	if err := a.readNames(); err != nil {
		return nil, err
	}
	// The links too, beside the maps: a restart misses no call. A link
	// taken back runs the last agent's program, with its sites map,
	// which it filled in, until the watch brings it to this config and
	// program (watch.Updated), whose sites this agent fills in before
	// they count (Resolved).
	links := filepath.Join(cfg.PinDir, "links")
	if a.w, err = watch.New(probes, spec, a.objs.AgentProbe, &watch.Options{Plan: opts, PinDir: links, Resolved: a.fill, Report: a.report}); err != nil {
		return nil, err
	}
	return a, nil
}

// pinDir makes dir, which must be on a BPF file system.
func pinDir(dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Dir(filepath.Clean(dir)), &st); err != nil {
		return fmt.Errorf("pin_dir %s: %w (mount a BPF file system: mount -t bpf bpf /sys/fs/bpf)", dir, err)
	}
	if st.Type != unix.BPF_FS_MAGIC {
		return fmt.Errorf("pin_dir %s: not on a BPF file system (mount one: mount -t bpf bpf /sys/fs/bpf)", dir)
	}
	return os.MkdirAll(dir, 0o700)
}

// readNames takes back the function numbers a last agent pinned.
func (a *agent) readNames() error {
	for i := range maxFuncs {
		var n fnName
		if err := a.objs.FnNames.Lookup(uint32(i), &n); err != nil {
			return fmt.Errorf("reading the pinned function names: %w", err)
		}
		probe, name, ok := bytes.Cut(bytes.TrimRight(n.Name[:], "\x00"), []byte{0})
		if !ok {
			break // the first free number
		}
		f := function{string(probe), string(name)}
		a.fn[f] = len(a.fns)
		a.fns = append(a.fns, f)
	}
	return nil
}

// number returns f's number, giving it the next if it has none; ok is
// false when every number is taken.
func (a *agent) number(f function) (int, bool) {
	if i, ok := a.fn[f]; ok {
		return i, true
	}
	if len(a.fns) == maxFuncs || len(f.probe)+len(f.name)+1 >= len(fnName{}.Name) {
		return 0, false
	}
	var n fnName
	copy(n.Name[:], f.probe+"\x00"+f.name)
	if err := a.objs.FnNames.Put(uint32(len(a.fns)), &n); err != nil {
		return 0, false
	}
	a.fn[f] = len(a.fns)
	a.fns = append(a.fns, f)
	return len(a.fns) - 1, true
}

// report logs what the watch did, and fills in the sites of a file taken
// back from a pin (those the watch attaches, fill has before they count).
func (a *agent) report(r watch.Report) {
	switch {
	case r.What == watch.Skipped || r.What == watch.Rescanned:
		// Always: the watch says so once per file and reason (a
		// pattern that matches nothing in a file, not once per process).
		log.Printf("%s %s (process %d): %v", r.What, r.Path, r.PID, r.Err)
	case a.verbose:
		log.Printf("%s %s (process %d, %d sites) %v", r.What, r.Path, r.PID, len(r.Sites), r.Err)
	}
	if r.What == watch.Restored {
		a.fill(r)
	}
}

// fill fills in the sites of a file, with their functions' numbers, so
// that the program finds them; it passes over the sites it does not find.
func (a *agent) fill(r watch.Report) {
	a.mu.Lock()
	defer a.mu.Unlock()
	full := 0
	for _, s := range r.Sites {
		probe := a.probes[s.Probe.String()]
		if probe == "" {
			continue // taken back from a pin, of a probe no longer configured
		}
		fn, ok := a.number(function{probe, s.Name})
		if !ok {
			full++
			continue
		}
		site := agentSite{Fn: uint32(fn)}
		if s.Probe.Kind == multiprobe.Return {
			site.IsReturn = 1
			// The kernel's return probe runs after the return popped
			// the return address (x86-64; arm64 keeps it in a
			// register); a Go function's is at its return instruction.
			if s.Returns == nil && runtime.GOARCH == "amd64" {
				site.SpGain = 8
			}
		}
		if err := a.objs.Sites.Put(s.Cookie, &site); err != nil {
			log.Printf("%s: site %s: %v", r.Path, s.Name, err)
		}
	}
	if full > 0 {
		log.Printf("%s: %d functions past the agent's %d are not counted", r.Path, full, maxFuncs)
	}
}

// functions returns the functions counted, by number.
func (a *agent) functions() []function {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]function(nil), a.fns...)
}

// close leaves the links and counts pinned for the next agent; with
// unpin, it detaches everything and removes the pins (the agent is being
// removed from the node).
func (a *agent) close(unpin bool, pinDir string) error {
	var errs []error
	if unpin {
		errs = append(errs, a.w.Unpin())
	}
	errs = append(errs, a.w.Close())
	if unpin {
		for _, m := range []*ebpf.Map{a.objs.Counts, a.objs.Hists, a.objs.FnNames, a.objs.CgroupCounts, a.objs.OtherCounts, a.objs.Overflow} {
			errs = append(errs, m.Unpin())
		}
		os.Remove(filepath.Join(pinDir, "links"))
		os.Remove(pinDir)
	}
	errs = append(errs, a.objs.Close())
	return errors.Join(errs...)
}
