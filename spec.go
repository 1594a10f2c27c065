package multiprobe

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// ErrBadSpec is returned for a probe spec that does not parse.
var ErrBadSpec = errors.New("bad probe spec")

// Kind is where in a function a probe fires.
type Kind int

const (
	// Entry probes fire when the function is entered ("uprobe").
	Entry Kind = iota
	// Return probes fire when the function returns ("uretprobe").
	Return
	// USDT probes fire at a USDT (<sys/sdt.h>) probe site ("usdt"); the
	// program reads the probe's arguments with bpf/mp_usdt.bpf.h.
	USDT
)

// String returns the kind as a spec spells it: uprobe, uretprobe or usdt.
func (k Kind) String() string {
	switch k {
	case Entry:
		return "uprobe"
	case Return:
		return "uretprobe"
	case USDT:
		return "usdt"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// A Probe is one parsed probe spec.
type Probe struct {
	Kind Kind
	// Target is the binary as written in the spec: a path, or a bare
	// library or program name. A path may hold globs
	// (/usr/lib/*/libssl.so*): every file it matches is a target, with a
	// link of its own; "*" with Options.PID is every file the process
	// maps executable.
	Target string
	// Patterns are glob patterns over the target's function names; those
	// starting with '!' exclude. A USDT probe has one pattern,
	// "provider:name", both parts globs.
	Patterns []string
}

// String returns the probe in the syntax ParseProbe reads.
func (p Probe) String() string {
	return p.Kind.String() + ":" + p.Target + ":" + strings.Join(p.Patterns, ",")
}

// ParseProbe parses a probe spec in bpftrace's syntax:
//
//	uprobe:TARGET:PATTERN[,PATTERN...]
//	uretprobe:TARGET:PATTERN[,PATTERN...]
//
//	usdt:TARGET:PROVIDER:NAME
//	usdt:TARGET:NAME
//
// "u" and "ur" abbreviate the kinds, as in bpftrace. TARGET is a path
// (/usr/bin/bash, /proc/1234/root/usr/lib/libssl.so.3) or a bare name
// (libc.so.6, bash). A PATTERN is a glob ('*', '?', '[a-z]', '[!x]'); one
// starting with '!' removes what it matches from the others' selection.
//
// A spec holds one probe: bpftrace's list of probes in one argument
// ("uprobe:/bin/bash:xmalloc,uretprobe:/bin/bash:xfree") is an error here
// that says so; ParseProbes reads it as two.
func ParseProbe(spec string) (Probe, error) {
	if list := splitList(spec); len(list) > 1 {
		return Probe{}, fmt.Errorf("%w %q: %d probes in one spec: give each as a spec of its own (%q)", ErrBadSpec, spec, len(list), strings.Join(list, `" "`))
	}
	kind, rest, ok := strings.Cut(spec, ":")
	if !ok {
		return Probe{}, fmt.Errorf("%w %q: want uprobe:TARGET:PATTERN", ErrBadSpec, spec)
	}
	var p Probe
	switch kind {
	case "uprobe", "u":
		p.Kind = Entry
	case "uretprobe", "ur":
		p.Kind = Return
	case "usdt", "U":
		return parseUSDT(spec, rest)
	case "kprobe", "k", "kretprobe", "kr", "tracepoint", "t", "rawtracepoint", "rt", "fentry", "f", "kfunc",
		"fexit", "fr", "kretfunc", "software", "s", "hardware", "h", "profile", "p", "interval", "i", "watchpoint", "w":
		return Probe{}, fmt.Errorf("%w %q: %s probes the kernel, and multiprobe probes user space: use uprobe, uretprobe or usdt", ErrBadSpec, spec, kind)
	default:
		return Probe{}, fmt.Errorf("%w %q: unknown probe type %q (want uprobe, uretprobe or usdt)", ErrBadSpec, spec, kind)
	}
	// The patterns follow the last ':', so a target path may contain ':'
	// but a pattern may not; C++ and Go names with "::" are matched with
	// '*' instead.
	i := strings.LastIndexByte(rest, ':')
	if i < 0 {
		return Probe{}, fmt.Errorf("%w %q: missing the function pattern (want %s:TARGET:PATTERN)", ErrBadSpec, spec, kind)
	}
	p.Target, p.Patterns = rest[:i], strings.Split(rest[i+1:], ",")
	if err := p.check(spec); err != nil {
		return Probe{}, err
	}
	return p, nil
}

// ParseProbes parses several specs, stopping at the first error. A spec
// that lists several probes, as bpftrace takes them in one argument
// ("uprobe:/bin/bash:xmalloc,uretprobe:/bin/bash:xfree"), is read as that
// many specs.
func ParseProbes(specs ...string) ([]Probe, error) {
	probes := make([]Probe, 0, len(specs))
	for _, s := range specs {
		for _, one := range splitList(s) {
			p, err := ParseProbe(one)
			if err != nil {
				return nil, err
			}
			probes = append(probes, p)
		}
	}
	return probes, nil
}

// probeKinds are the words a spec starts with, as ParseProbe reads them.
var probeKinds = []string{"uprobe", "u", "uretprobe", "ur", "usdt", "U"}

// splitList splits spec where a ',' is followed by another probe
// ("...,uretprobe:..."): a pattern never holds a ':', so a ',' before a
// kind and a ':' starts the next probe.
func splitList(spec string) []string {
	var out []string
	start := 0
	for i := 0; i < len(spec); i++ {
		if spec[i] != ',' {
			continue
		}
		kind, _, ok := strings.Cut(spec[i+1:], ":")
		if ok && slices.Contains(probeKinds, kind) {
			out = append(out, spec[start:i])
			start = i + 1
		}
	}
	return append(out, spec[start:])
}

func containsInclusion(patterns []string) bool {
	for _, p := range patterns {
		if !strings.HasPrefix(p, "!") {
			return true
		}
	}
	return false
}

// parseUSDT parses what follows "usdt:": TARGET:PROVIDER:NAME, or
// TARGET:NAME for a name in any provider. With three parts, the target is
// everything before the last two colons.
func parseUSDT(spec, rest string) (Probe, error) {
	parts := strings.Split(rest, ":")
	p := Probe{Kind: USDT}
	switch {
	case len(parts) >= 3:
		p.Target = strings.Join(parts[:len(parts)-2], ":")
		p.Patterns = []string{parts[len(parts)-2] + ":" + parts[len(parts)-1]}
	case len(parts) == 2:
		p.Target = parts[0]
		p.Patterns = []string{"*:" + parts[1]}
	default:
		return Probe{}, fmt.Errorf("%w %q: want usdt:TARGET:PROVIDER:NAME", ErrBadSpec, spec)
	}
	if err := p.check(spec); err != nil {
		return Probe{}, err
	}
	return p, nil
}

// check is the one set of rules a Probe keeps, whether ParseProbe made it
// or a caller built it: what ParseProbe refuses, Resolve refuses too.
// spec names the probe in the error: the text it was parsed from, or "".
func (p *Probe) check(spec string) error {
	if spec == "" {
		spec = p.String()
	}
	switch p.Kind {
	case Entry, Return, USDT:
	default:
		return fmt.Errorf("%w %q: unknown Kind %d (want Entry, Return or USDT)", ErrBadSpec, spec, int(p.Kind))
	}
	if p.Target == "" {
		return fmt.Errorf("%w %q: empty target (want a path or a library name)", ErrBadSpec, spec)
	}
	if p.Kind == USDT {
		if len(p.Patterns) != 1 {
			return fmt.Errorf("%w %q: want one PROVIDER:NAME glob pattern", ErrBadSpec, spec)
		}
		provider, name, ok := strings.Cut(p.Patterns[0], ":")
		if !ok || provider == "" || name == "" || strings.ContainsAny(p.Patterns[0], ",!") || strings.Contains(name, ":") {
			return fmt.Errorf("%w %q: want one PROVIDER:NAME glob pattern", ErrBadSpec, spec)
		}
		return nil
	}
	if len(p.Patterns) == 0 {
		return fmt.Errorf("%w %q: empty pattern", ErrBadSpec, spec)
	}
	for _, pat := range p.Patterns {
		switch {
		case pat == "" || pat == "!":
			return fmt.Errorf("%w %q: empty pattern", ErrBadSpec, spec)
		case strings.ContainsAny(pat, ":,"):
			// The text form could not carry it: the patterns follow the
			// target's last ':', split at ','.
			return fmt.Errorf("%w %q: pattern %q has a ':' or ','; match C++ and Go names' \"::\" with '*'", ErrBadSpec, spec, pat)
		}
	}
	if !containsInclusion(p.Patterns) {
		return fmt.Errorf("%w %q: only exclusions: add a pattern that selects functions", ErrBadSpec, spec)
	}
	return nil
}
