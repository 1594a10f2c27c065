package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/elfsym"
	"github.com/multiprobe/multiprobe/usdt"
)

func init() {
	commands["usdt"] = &command{
		usage: "[--json] [-p PID] TARGET [PROVIDER:NAME] | usdt:TARGET:PROVIDER:NAME...",
		short: "list the USDT probes of an ELF file: sites, semaphores, decoded arguments (no root needed)",
		long: `TARGET is a path, or a bare library or program name. PROVIDER:NAME is a
pair of globs; without it, every probe is listed. Probe specs as count takes
them (usdt:TARGET:PROVIDER:NAME) work too, several at once. With -p PID and
no TARGET, every file the process maps is searched; with a TARGET, it is
looked up in the process's root directory. ARGUMENTS are the probe's
argument specs as multiprobe decoded them for the BPF side
(bpf/mp_usdt.bpf.h).`,
		examples: []string{
			"usdt libstdc++.so.6                  # libstdc++'s probes (throw, rethrow, catch)",
			"usdt /usr/bin/python3.11 'python:function__*'",
			"usdt 'usdt:python3.11:python:function__*'",
			"usdt -p 1234                         # in every file process 1234 maps",
			"usdt --json libstdc++ 'libstdcxx:*'",
		},
		run: runUSDT,
	}
}

type listedProbe struct {
	Path            string       `json:"path,omitempty"`
	Provider        string       `json:"provider"`
	Name            string       `json:"name"`
	Semaphore       uint64       `json:"semaphore,omitempty"`
	SemaphoreOffset uint64       `json:"semaphore_offset,omitempty"`
	Sites           []listedUSDT `json:"sites"`
}

type listedUSDT struct {
	Address   uint64     `json:"address"`
	Offset    uint64     `json:"offset"`
	ArgString string     `json:"arg_string"`
	Args      []usdt.Arg `json:"args,omitempty"`
	ArgError  string     `json:"arg_error,omitempty"`
}

func runUSDT(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("usdt")
	asJSON := fs.Bool("json", false, "print JSON")
	var pid int
	fs.IntVar(&pid, "pid", 0, "search the files of process `PID`, or look the target up in its root")
	fs.IntVar(&pid, "p", 0, "short for --pid")
	pos, _, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if pid < 0 {
		return usagef("--pid %d: want a process id", pid)
	}
	var listings []listing
	switch {
	case len(pos) > 0 && isProbeSpec(pos[0]):
		if listings, err = listSpecs(pos, pid, true); err != nil {
			return err
		}
	case pid != 0 && len(pos) <= 1 && (len(pos) == 0 || strings.Contains(pos[0], ":")):
		pattern := "*:*"
		if len(pos) == 1 {
			pattern = pos[0]
		}
		var skipped []error
		if listings, skipped, err = usdtProcess(pid, pattern); err != nil {
			return err
		}
		for _, err := range skipped {
			fmt.Fprintf(stderr, "multiprobe usdt: left out: %v\n", err)
		}
	case len(pos) < 1 || len(pos) > 2:
		return usagef("need a target and at most one PROVIDER:NAME pattern, or usdt: probe specs")
	default:
		pattern := "*:*"
		if len(pos) == 2 {
			pattern = pos[1]
		}
		l, err := listProbe(multiprobe.Probe{Kind: multiprobe.USDT, Target: pos[0], Patterns: []string{pattern}}, pid)
		if err != nil {
			return err
		}
		listings = []listing{l}
	}
	if *asJSON {
		if len(listings) == 1 {
			l := listings[0]
			out := make([]listedProbe, len(l.usdt))
			for i, p := range l.usdt {
				out[i] = jsonProbe(p)
			}
			return writeJSON(stdout, struct {
				Path   string        `json:"path"`
				Arch   usdt.Arch     `json:"arch"`
				Probes []listedProbe `json:"probes"`
			}{l.path, l.arch, out})
		}
		out := []listedProbe{}
		for _, l := range listings {
			for _, p := range l.usdt {
				lp := jsonProbe(p)
				lp.Path = l.path
				out = append(out, lp)
			}
		}
		return writeJSON(stdout, struct {
			Probes []listedProbe `json:"probes"`
		}{out})
	}
	bw := bufio.NewWriter(stdout)
	for i, l := range listings {
		if i > 0 {
			fmt.Fprintln(bw)
		}
		if err := usdtTable(bw, l.path, l.arch, l.usdt); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// usdtProcess lists the USDT probes that pattern selects in every file
// process pid maps executable; files without any are left out, and those
// that cannot be read are too, each said so in skipped.
func usdtProcess(pid int, pattern string) (out []listing, skipped []error, err error) {
	maps, err := elfsym.ExecutableMappings(pid)
	if err != nil {
		return nil, nil, err
	}
	sameRoot := elfsym.ProcessRoot(pid) == ""
	for _, m := range maps {
		path := mappedPath(m, sameRoot)
		f, err := usdt.Open(path)
		if errors.Is(err, usdt.ErrNotELF) {
			continue // nothing to list
		}
		if err != nil {
			skipped = append(skipped, err)
			continue
		}
		probes, err := f.Probes(pattern)
		if err != nil || len(probes) == 0 {
			continue
		}
		out = append(out, listing{kind: multiprobe.USDT.String(), path: path, usdt: probes, arch: f.Arch, filter: pattern})
	}
	if len(out) == 0 {
		return nil, nil, errors.Join(append(skipped, fmt.Errorf("no USDT probe matches %s in the %d files process %d maps", pattern, len(maps), pid))...)
	}
	return out, skipped, nil
}

func jsonProbe(p usdt.Probe) listedProbe {
	lp := listedProbe{Provider: p.Provider, Name: p.Name, Semaphore: p.Semaphore, SemaphoreOffset: p.SemaphoreOffset, Sites: []listedUSDT{}}
	for _, s := range p.Sites {
		ls := listedUSDT{Address: s.Address, Offset: s.Offset, ArgString: s.ArgString, Args: s.Args}
		if s.ArgErr != nil {
			ls.ArgError = s.ArgErr.Error()
		}
		lp.Sites = append(lp.Sites, ls)
	}
	return lp
}

// writeJSON writes a report as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// usdtTable writes the probes of one file as a table.
func usdtTable(w io.Writer, path string, arch usdt.Arch, probes []usdt.Probe) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "PROBE\tSITES\tSEMAPHORE\tARGUMENTS")
	for _, p := range probes {
		sema := "-"
		if p.SemaphoreOffset != 0 {
			sema = fmt.Sprintf("%#x", p.SemaphoreOffset)
		}
		fmt.Fprintf(tw, "%s:%s\t%d\t%s\t%s\n", p.Provider, p.Name, len(p.Sites), sema, describeArgs(p.Sites[0]))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "%d %s in %s (%s)\n", len(probes), plural(len(probes), "probe", "probes"), path, arch)
	return nil
}

// describeArgs shows a site's decoded arguments, or why they are not.
func describeArgs(s usdt.Site) string {
	if s.ArgErr != nil {
		return "error: " + s.ArgErr.Error()
	}
	var parts []string
	for i, a := range s.Args {
		parts = append(parts, fmt.Sprintf("arg%d=%s", i, a))
	}
	return strings.Join(parts, " ")
}
