package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/multiprobe/multiprobe/elfsym"
	"github.com/multiprobe/multiprobe/usdt"
)

func init() {
	commands["usdt"] = &command{
		usage: "[--json] TARGET [PROVIDER:NAME]",
		short: "list the USDT probes of an ELF file: sites, semaphores, decoded arguments (no root needed)",
		long: `TARGET is a path, or a bare library or program name. PROVIDER:NAME is a
pair of globs; without it, every probe is listed. ARGUMENTS are the probe's
argument specs as multiprobe decoded them for the BPF side (bpf/mp_usdt.bpf.h).`,
		examples: []string{
			"usdt libc.so.6                       # glibc's probes (setjmp, memory_*, ...)",
			"usdt /usr/bin/python3.11 'python:function__*'",
			"usdt --json libc.so.6 'libc:memory_*'",
		},
		run: runUSDT,
	}
}

type listedProbe struct {
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
	pos, _, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) < 1 || len(pos) > 2 {
		return usagef("need a target and at most one PROVIDER:NAME pattern")
	}
	path, err := elfsym.LookPath(pos[0])
	if err != nil {
		return err
	}
	f, err := usdt.Open(path)
	if err != nil {
		return err
	}
	pattern := ""
	if len(pos) == 2 {
		pattern = pos[1]
	}
	probes, err := f.Probes(pattern)
	if err != nil {
		return err
	}
	if *asJSON {
		out := make([]listedProbe, len(probes))
		for i, p := range probes {
			lp := listedProbe{Provider: p.Provider, Name: p.Name, Semaphore: p.Semaphore, SemaphoreOffset: p.SemaphoreOffset}
			for _, s := range p.Sites {
				ls := listedUSDT{Address: s.Address, Offset: s.Offset, ArgString: s.ArgString, Args: s.Args}
				if s.ArgErr != nil {
					ls.ArgError = s.ArgErr.Error()
				}
				lp.Sites = append(lp.Sites, ls)
			}
			out[i] = lp
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			Path   string        `json:"path"`
			Arch   usdt.Arch     `json:"arch"`
			Probes []listedProbe `json:"probes"`
		}{path, f.Arch, out})
	}
	tw := tabwriter.NewWriter(stdout, 0, 8, 2, ' ', 0)
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
	fmt.Fprintf(stdout, "%d %s in %s (%s)\n", len(probes), plural(len(probes), "probe", "probes"), path, f.Arch)
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
