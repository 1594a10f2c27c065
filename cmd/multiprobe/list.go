package main

import (
	"bufio"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/multiprobe/multiprobe/elfsym"
	"github.com/multiprobe/multiprobe/ifunc"
)

func init() {
	commands["list"] = &command{
		usage: "[--json] TARGET PATTERN...",
		short: "list the sites that glob patterns select in an ELF file (no root needed)",
		long: `TARGET is a path, or a bare library or program name (libc.so.6, bash)
looked up as the dynamic loader and the shell would. A pattern is a glob;
one starting with '!' removes what it matches. Each row is a site: where a
probe goes (OFFSET, a file offset), what the symbol table says of it, and a
NOTE where the probe goes elsewhere than the symbol points (after a Go
function's stack check; an IFUNC's implementation instead of its resolver).`,
		examples: []string{
			"list /bin/bash 'sh_set*'             # bash's functions named sh_set...",
			"list libc.so.6 'str*' '!strn*'       # libc's str* functions but strn*",
			"list --json libc.so.6 malloc free    # as JSON",
		},
		run: runList,
	}
}

// listedSite is the JSON form of a site.
type listedSite struct {
	Name    string   `json:"name"`
	Aliases []string `json:"aliases,omitempty"`
	Version string   `json:"version,omitempty"`
	Bind    string   `json:"bind"`
	Type    string   `json:"type"`
	Size    uint64   `json:"size"`
	Address uint64   `json:"address"`
	// Offset is where the probe goes; SymbolOffset where the symbol
	// points, and Moved why they differ (a Go function's stack check).
	Offset       uint64 `json:"offset"`
	SymbolOffset uint64 `json:"symbol_offset"`
	Moved        string `json:"moved,omitempty"`
}

func runList(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("list")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, _, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) < 2 {
		return usagef("need a target and at least one pattern")
	}
	path, err := elfsym.LookPath(pos[0])
	if err != nil {
		return err
	}
	sites, err := elfsym.Resolve(path, pos[1:]...)
	if err != nil {
		return err
	}
	listIFuncs(path, sites)
	if *asJSON {
		out := make([]listedSite, len(sites))
		for i, s := range sites {
			out[i] = listedSite{
				Name: s.Name, Aliases: s.Aliases, Version: s.Version,
				Bind: symBind(s), Type: symType(s),
				Size: s.Size, Address: s.Address, Offset: s.Offset,
				SymbolOffset: s.SymbolOffset, Moved: s.Moved,
			}
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			Path  string       `json:"path"`
			Sites []listedSite `json:"sites"`
		}{path, out})
	}
	// Buffered: the tabwriter writes each cell on its own, thousands of
	// write calls for a long listing.
	bw := bufio.NewWriter(stdout)
	tw := tabwriter.NewWriter(bw, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tOFFSET\tSIZE\tTYPE\tBIND\tALIASES\tNOTE")
	for _, s := range sites {
		name := s.Name
		if s.Version != "" && !strings.Contains(name, "@") {
			name += "@@" + s.Version
		}
		note := s.Moved
		if s.Moved == elfsym.MovedGoStackCheck {
			note = fmt.Sprintf("symbol at %#x; probed %s", s.SymbolOffset, s.Moved)
		}
		fmt.Fprintf(tw, "%s\t%#x\t%d\t%s\t%s\t%s\t%s\n", name, s.Offset, s.Size, symType(s), symBind(s), strings.Join(s.Aliases, ","), note)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%d %s in %s\n", len(sites), plural(len(sites), "site", "sites"), path)
	return nil
}

func symType(s elfsym.Site) string {
	if s.Type == elf.STT_GNU_IFUNC {
		// debug/elf names value 10 by its range, STT_LOOS.
		return "IFUNC"
	}
	return strings.TrimPrefix(s.Type.String(), "STT_")
}

func symBind(s elfsym.Site) string {
	if b := s.Bind.String(); !strings.HasPrefix(b, "STB_") {
		return "UNIQUE"
	}
	return strings.TrimPrefix(s.Bind.String(), "STB_")
}

// listIFuncs says, for each IFUNC site, where the implementation this
// machine's loader selects is, as count would probe it (ifunc.Sites).
func listIFuncs(path string, sites []elfsym.Site) {
	offsets, moved := ifunc.Sites(path, sites)
	for i := range sites {
		sites[i].Offset, sites[i].Moved = offsets[i], moved[i]
	}
}
