package main

import (
	"bufio"
	"cmp"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/elfsym"
	"github.com/multiprobe/multiprobe/ifunc"
	"github.com/multiprobe/multiprobe/internal/fds"
	"github.com/multiprobe/multiprobe/internal/glob"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/usdt"
)

func init() {
	commands["list"] = &command{
		usage: "[--json] [-p PID] PROBE... | TARGET [PATTERN...]",
		short: "list the sites that probe specs or glob patterns select (no root needed)",
		long: `PROBE is a spec as count takes it (uprobe:TARGET:PATTERN,...,
uretprobe:..., usdt:TARGET:PROVIDER:NAME); the older form, a TARGET and its
patterns, still works; a TARGET alone lists all its functions, as bpftrace -l
does. TARGET is a path, or a bare library or program name (libc.so.6, libc,
bash). A pattern is a glob; one starting with '!' removes what it matches. With -p PID and no PROBE, every file the process maps is
listed (PATTERNs, if given, select its functions, as bpftrace -lp does);
with a PROBE, its TARGET is looked up in the process's root directory.

Each row is a site: where a probe goes (OFFSET, a file offset), what the
symbol table says of it, and a NOTE where the probe goes elsewhere than the
symbol points (after a Go function's stack check; an IFUNC's implementation
instead of its resolver).`,
		examples: []string{
			"list 'uprobe:/bin/bash:sh_set*'        # bash's functions named sh_set...",
			"list 'uprobe:libc:str*,!strn*' 'usdt:python3.11:python:function__*'",
			"list /bin/bash 'sh_set*'               # the same as the first",
			"list -p 1234 'malloc*'                 # in every file process 1234 maps",
			"list libc                              # every function of libc",
			"list --json libc.so.6 malloc free",
		},
		run: runList,
	}
}

// listedSite is the JSON form of a site.
type listedSite struct {
	// Kind and Path are the probe's kind (uprobe, uretprobe) and the
	// file, as it was looked up.
	Kind    string   `json:"kind"`
	Path    string   `json:"path"`
	Name    string   `json:"name"`
	Aliases []string `json:"aliases,omitempty"`
	Version string   `json:"version,omitempty"`
	Bind    string   `json:"bind"`
	Type    string   `json:"type"`
	Size    uint64   `json:"size"`
	Address uint64   `json:"address"`
	// Offset is where the probe goes; SymbolOffset where the symbol
	// points, and Moved why they differ (a Go function's stack check, an
	// IFUNC's implementation), with a Note where there is more to say.
	Offset       uint64 `json:"offset"`
	SymbolOffset uint64 `json:"symbol_offset"`
	Moved        string `json:"moved,omitempty"`
	Note         string `json:"note,omitempty"`
	// LeftOut says why count leaves the site out (multiprobe.Unprobeable).
	LeftOut string `json:"left_out,omitempty"`
}

// A listing is what one probe, or one file of a process, selects.
type listing struct {
	kind   string // uprobe, uretprobe or usdt
	path   string
	sites  []elfsym.Site
	left   []error // by site: why count would leave it out, or nil
	usdt   []usdt.Probe
	arch   usdt.Arch
	filter string // for usdt: the PROVIDER:NAME pattern
}

func runList(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("list")
	asJSON := fs.Bool("json", false, "print JSON")
	var pid int
	fs.IntVar(&pid, "pid", 0, "list the files of process `PID`, or look targets up in its root")
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
		if listings, err = listSpecs(pos, pid, false); err != nil {
			return err
		}
	case pid != 0:
		patterns := pos
		if len(patterns) == 0 {
			patterns = []string{"*"}
		}
		var skipped []error
		if listings, skipped, err = listProcess(pid, patterns); err != nil {
			return err
		}
		for _, err := range skipped {
			fmt.Fprintf(stderr, "multiprobe list: left out: %v\n", err)
		}
	case len(pos) == 0:
		return usagef("need probe specs (uprobe:TARGET:PATTERN), or a target and its patterns")
	default:
		patterns := pos[1:]
		if len(patterns) == 0 {
			patterns = []string{"*"}
		}
		l, err := listProbe(multiprobe.Probe{Kind: multiprobe.Entry, Target: pos[0], Patterns: patterns}, 0)
		if err != nil {
			return err
		}
		listings = []listing{l}
	}
	if *asJSON {
		return listJSON(stdout, listings)
	}
	return listTable(stdout, listings)
}

// listSpecs resolves probe specs, their targets looked up in process pid's
// root if pid is not 0; with usdtOnly, a spec of another kind is a usage
// error.
func listSpecs(specs []string, pid int, usdtOnly bool) ([]listing, error) {
	probes, err := multiprobe.ParseProbes(specs...)
	if err != nil {
		return nil, usagef("%v", err)
	}
	var out []listing
	for _, p := range probes {
		if usdtOnly && p.Kind != multiprobe.USDT {
			return nil, usagef("%s is not a usdt: probe (list shows uprobe sites)", p)
		}
		if glob.IsLiteral(p.Target) {
			l, err := listProbe(p, pid)
			if err != nil {
				return nil, err
			}
			out = append(out, l)
			continue
		}
		ls, err := listGlob(p, pid)
		if err != nil {
			return nil, err
		}
		out = append(out, ls...)
	}
	return out, nil
}

// listGlob lists p in every file its target's glob matches
// (/usr/lib/*/libssl.so*), as count probes them: where nothing matches,
// or that are not ELF files, are left out.
func listGlob(p multiprobe.Probe, pid int) ([]listing, error) {
	root := ""
	if pid != 0 {
		root = elfsym.ProcessRoot(pid)
	}
	if p.Target == "*" {
		return nil, usagef("%s: for every file a process maps give -p PID and no probe", p)
	}
	files, err := elfsym.GlobIn(root, p.Target)
	if errors.Is(err, elfsym.ErrBadPattern) {
		return nil, usagef("%s: %v", p, err)
	}
	if err != nil {
		return nil, err
	}
	var out []listing
	for _, f := range files {
		q := p
		q.Target = f
		l, err := listProbe(q, 0)
		if errors.Is(err, elfsym.ErrNoMatch) || errors.Is(err, elfsym.ErrNotELF) || errors.Is(err, usdt.ErrNoProbes) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: nothing matches in the %d files %q names: %w", p, len(files), p.Target, elfsym.ErrNoMatch)
	}
	return out, nil
}

// isProbeSpec reports whether arg starts as a probe spec does, rather than
// being a target (a path or a library's name, with no "uprobe:"-like
// prefix). bpftrace's kernel kinds (kprobe:, tracepoint:) count too, so
// that the parser says what is wrong with them.
func isProbeSpec(arg string) bool {
	kind, _, ok := strings.Cut(arg, ":")
	if !ok {
		return false
	}
	switch kind {
	case "uprobe", "u", "uretprobe", "ur", "usdt", "U",
		"kprobe", "kretprobe", "tracepoint", "rawtracepoint", "fentry", "fexit", "kfunc", "kretfunc",
		"software", "hardware", "profile", "interval", "watchpoint":
		return true
	}
	return false
}

// listProbe resolves one probe, its target looked up in process pid's root
// if pid is not 0.
func listProbe(p multiprobe.Probe, pid int) (listing, error) {
	root := ""
	if pid != 0 && !strings.HasPrefix(p.Target, "/proc/") {
		root = elfsym.ProcessRoot(pid)
	}
	path, err := elfsym.LookPathIn(root, p.Target)
	if err != nil {
		return listing{}, err
	}
	l := listing{kind: p.Kind.String(), path: path}
	if p.Kind == multiprobe.USDT {
		f, err := usdt.Open(path)
		if err != nil {
			return l, err
		}
		l.arch, l.filter = f.Arch, p.Patterns[0]
		l.usdt, err = f.Probes(p.Patterns[0])
		return l, err
	}
	l.sites, l.left, err = resolveSites(path, p.Patterns, p.Kind)
	return l, err
}

// listProcess resolves patterns in every file process pid maps executable.
// A file where nothing matches is left out; none matching anywhere is an
// error, as for one file. A file that cannot be read is left out too, and
// said so in skipped, when others matched.
func listProcess(pid int, patterns []string) (out []listing, skipped []error, err error) {
	maps, err := elfsym.ExecutableMappings(pid)
	if err != nil {
		return nil, nil, err
	}
	var errs []error
	sameRoot := elfsym.ProcessRoot(pid) == ""
	for _, m := range maps {
		path := mappedPath(m, sameRoot)
		sites, left, err := resolveSites(path, patterns, multiprobe.Entry)
		if errors.Is(err, elfsym.ErrNoMatch) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, listing{kind: multiprobe.Entry.String(), path: path, sites: sites, left: left})
	}
	if len(out) == 0 {
		if len(errs) > 0 {
			return nil, nil, errors.Join(errs...)
		}
		return nil, nil, fmt.Errorf("no function matches %s in the %d files process %d maps: %w", strings.Join(patterns, " "), len(maps), pid, elfsym.ErrNoMatch)
	}
	return out, errs, nil
}

// mappedPath names a file a process maps: by the process's own path where
// it shares this process's root and the file is still there, else through
// /proc/PID/root, which reaches the very file mapped.
func mappedPath(m elfsym.Mapping, sameRoot bool) string {
	if sameRoot && !m.Deleted {
		return m.Path
	}
	return m.HostPath
}

func listJSON(w io.Writer, listings []listing) error {
	out := struct {
		// Path is the file, when there is one.
		Path  string        `json:"path,omitempty"`
		Sites []listedSite  `json:"sites"`
		USDT  []listedProbe `json:"usdt,omitempty"`
	}{Sites: []listedSite{}}
	if len(listings) == 1 {
		out.Path = listings[0].path
	}
	for _, l := range listings {
		for i, s := range l.sites {
			out.Sites = append(out.Sites, listedSite{
				LeftOut: errString(l.left[i]),
				Kind:    l.kind, Path: l.path,
				Name: s.Name, Aliases: s.Aliases, Version: s.Version,
				Bind: symBind(s), Type: symType(s),
				Size: s.Size, Address: s.Address, Offset: s.Offset,
				SymbolOffset: s.SymbolOffset, Moved: movedName(s.Moved), Note: s.Note,
			})
		}
		for _, p := range l.usdt {
			lp := jsonProbe(p)
			lp.Path = l.path
			out.USDT = append(out.USDT, lp)
		}
	}
	return writeJSON(w, out)
}

// maxAliases is how many of a site's aliases the table shows; JSON has
// them all.
const maxAliases = 5

func listTable(w io.Writer, listings []listing) error {
	bw := bufio.NewWriter(w)
	grouped := len(listings) > 1 || len(listings) == 1 && listings[0].kind != multiprobe.Entry.String()
	sites, files := 0, map[string]bool{}
	for i, l := range listings {
		if i > 0 {
			fmt.Fprintln(bw)
		}
		if l.kind == multiprobe.USDT.String() {
			if err := usdtTable(bw, l.path, l.arch, l.usdt); err != nil {
				return err
			}
			continue
		}
		if grouped {
			fmt.Fprintf(bw, "%s (%s):\n", l.path, l.kind)
		}
		siteTable(bw, l.sites, l.left)
		sites += len(l.sites)
		files[l.path] = true
		if !grouped {
			fmt.Fprintf(bw, "%d %s in %s\n", len(l.sites), plural(len(l.sites), "site", "sites"), l.path)
		}
	}
	if grouped && sites > 0 {
		fmt.Fprintf(bw, "%d %s in %d %s\n", sites, plural(sites, "site", "sites"), len(files), plural(len(files), "file", "files"))
	}
	return bw.Flush()
}

// siteTable writes one row per site, its columns padded as a tabwriter
// would, with two spaces between them. The name comes last, with the
// aliases and the note after it, unpadded: a C++ name runs to hundreds of
// characters, a folded function's aliases to tens of thousands (node's
// widest listing was 2.6 GB with these columns padded).
//
// The widths are measured in a first pass rather than by a tabwriter,
// which holds every cell of the table until it is flushed: for node's 546
// uv_* sites that was 100 KB of cells, and 65 of the process's 470 page
// faults.
func siteTable(w *bufio.Writer, sites []elfsym.Site, left []error) {
	const gap = 2
	head := [4]string{"OFFSET", "SIZE", "TYPE", "BIND"}
	var width [4]int
	for c, h := range head {
		width[c] = len(h)
	}
	var num []byte
	for _, s := range sites {
		width[0] = max(width[0], len(strconv.AppendUint(append(num[:0], "0x"...), s.Offset, 16)))
		width[1] = max(width[1], len(strconv.AppendUint(num[:0], s.Size, 10)))
		width[2] = max(width[2], len(symType(s)))
		width[3] = max(width[3], len(symBind(s)))
	}
	pad := func(n int) {
		for ; n > 0; n-- {
			w.WriteByte(' ')
		}
	}
	cell := func(c int, b []byte) {
		w.Write(b)
		pad(width[c] + gap - len(b))
	}
	for c, h := range head {
		cell(c, []byte(h))
	}
	w.WriteString("NAME\n")
	for i, s := range sites {
		num = strconv.AppendUint(append(num[:0], "0x"...), s.Offset, 16)
		cell(0, num)
		cell(1, strconv.AppendUint(num[:0], s.Size, 10))
		t, b := symType(s), symBind(s)
		w.WriteString(t)
		pad(width[2] + gap - len(t))
		w.WriteString(b)
		pad(width[3] + gap - len(b))
		w.WriteString(s.Name)
		if s.Version != "" && !strings.Contains(s.Name, "@") {
			w.WriteString("@@" + s.Version)
		}
		if n := len(s.Aliases); n > 0 {
			w.WriteString("  aliases: " + strings.Join(s.Aliases[:min(n, maxAliases)], ","))
			if n > maxAliases {
				fmt.Fprintf(w, " and %d more", n-maxAliases)
			}
		}
		switch {
		case s.Moved == elfsym.MovedGoStackCheck:
			fmt.Fprintf(w, "  note: symbol at %#x; probed %s", s.SymbolOffset, s.Moved)
		case s.Moved != elfsym.NotMoved:
			fmt.Fprintf(w, "  note: %s (%s)", s.Moved, s.Note)
		}
		if left[i] != nil {
			w.WriteString("  left out: " + left[i].Error())
		}
		w.WriteByte('\n')
	}
}

// errString is err's message, or "" for nil.
func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// movedName is a Move as the JSON listing spells it: "" for none.
func movedName(m elfsym.Move) string {
	if m == elfsym.NotMoved {
		return ""
	}
	return m.String()
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

// resolveSites resolves patterns in the file at path and, for each IFUNC
// site, finds the implementation this machine's loader selects in that
// same open file, as count would probe it (ifunc.Sites). A site that a
// probe of kind cannot go at says why in its note, as count leaves it out
// (multiprobe.Unprobeable): left holds why, by site.
func resolveSites(path string, patterns []string, kind multiprobe.Kind) (sites []elfsym.Site, left []error, err error) {
	fd, err := fds.OpenRegular(path)
	if err != nil {
		return nil, nil, err
	}
	defer fd.Close()
	f, err := elfsym.OpenFile(fd)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	if sites, err = f.Resolve(patterns...); err != nil {
		return nil, nil, err
	}
	sites = mergeSameOffset(ifunc.Sites(fd, sites))
	implementationSizes(f, sites)
	left = make([]error, len(sites))
	code := make([]byte, kernelprobe.InsnWindow)
	for i, s := range sites {
		n, _ := fd.ReadAt(code, int64(s.Offset))
		left[i] = multiprobe.Unprobeable(kind, f, s, code[:n])
	}
	return sites, left, nil
}

// implementationSizes gives each IFUNC site moved to its implementation
// the implementation's size, where a symbol covers it (.symtab, or a debug
// file's: __memmove_avx_unaligned_erms for memcpy), instead of its
// resolver's.
func implementationSizes(f *elfsym.File, sites []elfsym.Site) {
	if !slices.ContainsFunc(sites, func(s elfsym.Site) bool { return s.Moved == elfsym.MovedIFunc }) {
		return
	}
	all, err := f.Resolve("*")
	if err != nil {
		return
	}
	for i := range sites {
		s := &sites[i]
		if s.Moved != elfsym.MovedIFunc {
			continue
		}
		// The last symbol at or before the offset (which may be past the
		// implementation's first instruction), if it covers it.
		j, _ := slices.BinarySearchFunc(all, s.Offset+1, func(a elfsym.Site, off uint64) int { return cmp.Compare(a.Offset, off) })
		if j > 0 && s.Offset < all[j-1].Offset+all[j-1].Size {
			s.Size = all[j-1].Size
		}
	}
}

// mergeSameOffset makes the sites at one offset one row, as a plan makes
// them one site: IFUNCs whose resolvers pick one implementation (memcpy
// and memmove on many machines). The first keeps its name, and the
// others' names are its aliases.
func mergeSameOffset(sites []elfsym.Site) []elfsym.Site {
	first := make(map[uint64]int, len(sites))
	out := sites[:0]
	for _, s := range sites {
		if i, ok := first[s.Offset]; ok {
			// Clipped: the aliases may share an array with the input's.
			out[i].Aliases = append(slices.Clip(out[i].Aliases), s.Name)
			out[i].Aliases = append(out[i].Aliases, s.Aliases...)
			continue
		}
		first[s.Offset] = len(out)
		out = append(out, s)
	}
	return out
}
