package multiprobe

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"

	"github.com/multiprobe/multiprobe/attach"
	"github.com/multiprobe/multiprobe/elfsym"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/usdt"
	"golang.org/x/sys/unix"
)

// A Site is one place a probe attaches to: a function, or a USDT probe's
// location.
type Site struct {
	// Name is the function's symbol, or "provider:name" for a USDT site.
	Name string
	// Names, where the plan's probes reach the site by more than one name,
	// are all of them, Name first: the site of IFUNCs that resolve to one
	// implementation (memcpy and memmove on many machines), or of one
	// function that two specs select by different names. The site is
	// attached once, so a call is counted once. Nil for a site of one
	// name; the symbol's own aliases are in Symbol.Aliases.
	Names []string
	// Offset is the file offset the kernel probes.
	Offset uint64
	// Probe is the spec that selected the site, shared by all its sites.
	Probe *Probe
	// Path is the file the probe's target resolved to.
	Path string
	// Cookie is the site's BPF cookie: its index in the sites of the plan
	// (plus Options.CookieBase), which mp_cookie (bpf/mp_cookie.bpf.h) returns in the program, and
	// mp_usdt_cookie for a USDT site, whose kernel cookie also carries its
	// argument spec id.
	Cookie uint64
	// Moved says where Offset is against where the symbol points, and
	// Note says more where there is more (see elfsym.Site): after a Go
	// function's stack check, at an IFUNC's implementation, or at its
	// resolver and why. A USDT site is where its note says.
	Moved elfsym.Move
	Note  string
	// Returns, for a uretprobe spec's site in a Go program, are the file
	// offsets of the function's return instructions, where entry probes
	// stand for the kernel's return probe (which Go's unwinder cannot
	// walk): the program runs there with the site's cookie and the
	// results in their registers (RAX, RBX, ... on x86-64; R0, R1, ... on
	// arm64), where PT_REGS_RC reads the first. Offset is then the
	// function's entry, which is not probed.
	Returns []uint64
	// RefCtrOffset is the file offset of the USDT semaphore that the
	// kernel counts up while the site is attached, 0 for none.
	RefCtrOffset uint64
	// Symbol is the function's symbol, nil for a USDT site.
	Symbol *elfsym.Site
	// USDT is the probe site of a USDT probe, nil for a uprobe.
	USDT *usdt.Site
	// LeftOut, for a site of Plan.LeftOut, says why Resolve left it out of
	// the plan; nil for the plan's own sites.
	LeftOut error

	args *usdtArgs // a USDT site's decoded arguments
}

// String returns the site as a bpftrace probe names it, with its own name
// for the pattern: "uprobe:/usr/lib/x86_64-linux-gnu/libc.so.6:malloc",
// "usdt:/usr/bin/python3:python:line".
func (s Site) String() string {
	return s.ProbeKind() + ":" + s.Path + ":" + s.Name
}

// Label is the site's names joined by "/" ("memcpy/memmove"), or its Name.
func (s Site) Label() string {
	if len(s.Names) == 0 {
		return s.Name
	}
	return strings.Join(s.Names, "/")
}

// ProbeKind is the kind of the site's probe ("uprobe", "uretprobe",
// "usdt"), as package probetest reads it.
func (s Site) ProbeKind() string {
	if s.Probe == nil {
		return "uprobe"
	}
	return s.Probe.Kind.String()
}

// SiteName is s.Name, as package probetest reads it.
func (s Site) SiteName() string { return s.Name }

// Options are given once, to Resolve, and hold for the plan's Prepare and
// Attach. A nil *Options is the zero value.
type Options struct {
	// PID, if not 0, counts only calls made by the process with this pid
	// (all its threads, not its children). The kernel filters where it can
	// (uprobe_multi with the 6.10 fix); elsewhere each Link filters inside
	// BPF with a copy of the program of its own (see Link). A probe's
	// target is looked up in the process's root directory, so that a path
	// or library name means the file a process in a container or chroot
	// sees by that name.
	PID int
	// PIDs, if not empty, counts only calls made by these processes (and
	// PID, if set), through each Link's own in-BPF filter. A Link's set can
	// be changed while attached with Link.SetPIDs.
	PIDs []int
	// Descendants counts the calls of the processes that PID and PIDs
	// make, and of theirs, too: a child joins the Link's pid set as the
	// kernel makes it, before it runs, and leaves it at its exit (see
	// pidfilter.Filter.FollowForks), so that a command's calls count
	// also when a shell, timeout, a pipeline or a shim runs the target.
	// The filter is then always the Link's in-BPF one, with room for
	// DescendantPIDs processes at once. It needs kernel BTF. A pinned
	// Link follows forks while the Link that pinned it is open.
	Descendants bool
	// DebugDirs are where a stripped binary's separate debug file, whose
	// symbols complete its own, is looked for (see elfsym.OpenFileOptions):
	// nil means /usr/lib/debug, an empty non-nil slice nowhere.
	DebugDirs []string
	// Features, if not nil, replaces kernelprobe.Detect(): tests use it to
	// force a path.
	Features *kernelprobe.Features
	// Session attaches the uprobe specs' sites as uprobe sessions (Linux
	// 6.13+): prog, loaded from a SEC("uprobe.session") section, runs at
	// each site's entry and, if it returned 0 there, at the site's return.
	// Sessions exist only on the uprobe_multi path: elsewhere Resolve fails
	// with an error wrapping attach.ErrSessionUnsupported. uretprobe and
	// usdt specs cannot be sessions.
	Session bool
	// IFuncResolvers probes an IFUNC symbol (glibc's strlen, memcpy, ...)
	// where its symbol points: at the resolver, which the loader runs once
	// per process to choose an implementation. By default the site is that
	// implementation, the one this machine's loader chooses, or for a
	// library in a process's root (Options.PID, a container), the one that
	// process's loader chose (see package ifunc and Site.Moved).
	IFuncResolvers bool
	// GoKernelReturns makes a uretprobe spec on a Go program use the
	// kernel's return probe, as on any other binary, and allows sessions
	// there. That crashes the program as soon as its stack grows or is
	// walked (see ErrGoReturn): it is for showing that, not for use. By
	// default a uretprobe spec on a Go program probes each function's
	// return instructions with entry probes (see Site.Returns).
	GoKernelReturns bool
	// Updatable makes each Link able to change its probe set in place
	// (Link.Update) without missing a call or counting one twice. Attach
	// then loads a copy of the program with a generation check in front
	// (one more verification per Link; a copy the Link's pid filter makes
	// anyway carries it too), which costs each run one array read outside
	// an update. Link.Update explains how.
	Updatable bool
	// CookieBase is the first site's cookie: a site's cookie is CookieBase
	// plus its index in Plan.Sites. Plans that attach one program, whose
	// per-site maps are keyed by cookie, give each its own range (package
	// watch gives each build of a library one) so that their sites do not
	// share a key. Cookies of USDT sites share the kernel's 64 bits with
	// their argument spec id and must stay below 2^32.
	CookieBase uint64
	// Progress, if not nil, is told how a long phase advances: on the
	// perf-event path (before Linux 6.6), where each site costs tens of
	// milliseconds, the sites attached by Attach and detached by
	// Link.Close, per kind (entry or return). It is called about ten times a
	// second and once at the end of each phase, from a goroutine of its
	// own, never concurrently with itself. The uprobe_multi path attaches
	// a binary's sites in one call and reports nothing.
	Progress func(Progress)
}

// Progress is a report of Options.Progress.
type Progress struct {
	// Phase is "attach" or "detach".
	Phase string
	// Path is the binary whose sites these are, or "" for several.
	Path string
	// Done of Total sites are attached, or detached.
	Done, Total int
}

// setup fills in the kernel's features and checks the options.
func (pl *Plan) setup() error {
	if pl.opts.Features != nil {
		pl.features = *pl.opts.Features
	} else {
		f, err := kernelprobe.Detect()
		if err != nil {
			return err
		}
		pl.features = f
	}
	for _, pid := range append([]int{pl.opts.PID}, pl.opts.PIDs...) {
		if err := checkPID(pid); err != nil {
			return err
		}
	}
	if pl.opts.Session && (pl.features.Path() != kernelprobe.PathUprobeMulti || !pl.features.UprobeSession) {
		return fmt.Errorf("multiprobe: kernel %s, %s path: %w; attach entry and return probes instead",
			pl.features.Release, pl.features.Path(), attach.ErrSessionUnsupported)
	}
	return nil
}

// checkSession refuses probes that cannot be sessions: a return probe
// (a session runs at the return already) and a USDT site, which is not a
// function's entry, so the kernel's return probe would take whatever is at
// the stack pointer there for the return address.
func (pl *Plan) checkSession() error {
	if !pl.opts.Session {
		return nil
	}
	for _, pp := range pl.probes {
		if pp.probe.Kind != Entry {
			return fmt.Errorf("%w: %s with Options.Session: only uprobe specs can be sessions", ErrBadSpec, pp.probe)
		}
	}
	return nil
}

// checkPID fails for a pid that names no process now, so that every path
// reports it the same way: the kernel's pid filter would say ESRCH, the
// in-BPF one would silently count nothing.
func checkPID(pid int) error {
	if pid == 0 {
		return nil
	}
	if pid < 0 || int64(pid) > int64(^uint32(0)>>1) {
		return fmt.Errorf("pid %d: %w", pid, unix.EINVAL)
	}
	if err := unix.Kill(pid, 0); errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("process %d does not exist: %w", pid, err)
	}
	// A zombie or a kernel thread exists but runs no program: it would
	// count nothing, silently. Neither has an executable.
	if _, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe"); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("process %d runs no program (it has exited, or it is a kernel thread): %w", pid, unix.ESRCH)
	}
	return nil
}
