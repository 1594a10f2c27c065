package multiprobe

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/multiprobe/multiprobe/elfsym"
	"github.com/multiprobe/multiprobe/internal/glob"
	"github.com/multiprobe/multiprobe/kernelprobe"
)

// ErrNoReturnAddress is wrapped by the reason a return probe leaves out a
// function that is entered without a return address: the ELF entry point
// (_start), the dynamic loader's start, signal and context trampolines,
// the lazy binding resolver. The kernel's return probe replaces the word
// at the top of the stack at entry with its trampoline's address; there
// that word is argc, a signal frame, or the PLT's arguments, and the
// program reads the trampoline's address instead (a C program's argc
// became -8192) or crashes.
var ErrNoReturnAddress = errors.New("entered without a return address: a return probe would overwrite what the stack holds there")

// noReturnAddress reports whether the function name is entered without a
// return address on the stack. The ELF entry point is found by address;
// these are the functions glibc enters by a jump or a return.
func noReturnAddress(name string) bool {
	name, _, _ = strings.Cut(name, "@")
	switch name {
	case "_start", "_dl_start_user", "__restore_rt", "__start_context", "_dl_runtime_resolve", "_dl_runtime_profile":
		return true
	}
	return strings.HasPrefix(name, "_dl_runtime_resolve_") || strings.HasPrefix(name, "_dl_runtime_profile_")
}

// Unprobeable says why a probe of kind cannot go at site, a site of the
// ELF file f, whose code at site.Offset is code (kernelprobe.InsnWindow
// bytes, fewer at the end of the file), or returns nil: the rules by which
// Resolve leaves a glob's site out and refuses a site named exactly (see
// Plan.LeftOut). For tools that list sites as Resolve would probe them.
func Unprobeable(kind Kind, f *elfsym.File, site elfsym.Site, code []byte) error {
	return unprobeable(kind, f, site.Offset, code, func() string { return site.Name })
}

// unprobeable is Unprobeable with the name read only if needed: a glob's
// names cost more to build than its offsets.
func unprobeable(kind Kind, f *elfsym.File, off uint64, code []byte, name func() string) error {
	if err := kernelprobe.CheckInsn(f.Machine(), code); err != nil {
		return err
	}
	if kind != Return {
		return nil
	}
	if entry, ok := f.Entry(); ok && off == entry {
		return fmt.Errorf("the ELF entry point: %w", ErrNoReturnAddress)
	}
	if noReturnAddress(name()) {
		return ErrNoReturnAddress
	}
	return nil
}

// vet finds the sites of pp that cannot be probed: whose first instruction
// the kernel will not place a uprobe at (kernelprobe.CheckInsn), and for a
// return probe, those entered without a return address. A glob leaves
// them out (pp.left; Plan.LeftOut lists them); a site a probe names
// exactly is an error, which names the function and why.
func vet(pp *planned, f *elfsym.File) error {
	if pp.rets != nil {
		return nil // a Go function's returns, probed at their ret instructions
	}
	code := codeReader{f: pp.file}
	for k, off := range pp.offs {
		err := unprobeable(pp.probe.Kind, f, off, code.at(off), func() string { return pp.name(k) })
		if err == nil {
			continue
		}
		name := pp.name(k)
		if pp.probe.namesExactly(name) {
			return fmt.Errorf("%s in %s at %#x: %w", name, pp.file.path, off, err)
		}
		if pp.left == nil {
			pp.left = map[int32]error{}
		}
		pp.left[int32(k)] = err
	}
	if code.err != nil {
		return fmt.Errorf("reading the code of %s: %w", pp.file.path, code.err)
	}
	return nil
}

// namesExactly reports whether one of p's patterns is exactly name, with
// or without its version.
func (p *Probe) namesExactly(name string) bool {
	bare, _, _ := strings.Cut(name, "@")
	for _, pat := range p.Patterns {
		for _, part := range strings.Split(pat, ",") {
			if glob.IsLiteral(part) && !strings.HasPrefix(part, "!") && (part == name || part == bare) {
				return true
			}
		}
	}
	return false
}

// name is the name of pp's k'th site.
func (pp *planned) name(k int) string {
	if pp.ifuncs != nil {
		return pp.ifuncs[k].Name
	}
	return pp.sel.Sites()[k].Name
}

// codeReader reads the first instruction at file offsets, a block of the
// file at a time: a glob's sites are sorted by offset, and for node's
// 78,000 that is one read per 64 KiB of its code rather than one per site.
type codeReader struct {
	f     *openFile
	block []byte
	start uint64 // the file offset of block
	err   error
}

const codeBlock = 64 << 10

// at returns up to kernelprobe.InsnWindow bytes from off on: fewer at the
// end of the file.
func (c *codeReader) at(off uint64) []byte {
	if c.block == nil || off < c.start || off+kernelprobe.InsnWindow > c.start+uint64(len(c.block)) {
		c.start = off
		if c.block == nil {
			c.block = make([]byte, codeBlock)
		}
		c.block = c.block[:cap(c.block)]
		n, err := c.f.f.ReadAt(c.block, int64(off))
		if n == 0 && err != nil && c.err == nil && !errors.Is(err, io.EOF) {
			c.err = err
		}
		c.block = c.block[:n]
	}
	b := c.block[off-c.start:]
	return b[:min(len(b), kernelprobe.InsnWindow)]
}

// LeftOut returns the sites the probes' globs selected but Resolve left
// out, each with its LeftOut reason: an instruction the kernel will not
// place a uprobe at (wrapping kernelprobe.ErrUnprobeable), or for a return
// probe a function entered without a return address (wrapping
// ErrNoReturnAddress). They have no cookie. A site a probe names exactly
// is never left out: Resolve fails instead.
func (pl *Plan) LeftOut() []Site {
	var out []Site
	for i := range pl.probes {
		pp := &pl.probes[i]
		ks := slices.Sorted(maps.Keys(pp.left))
		for _, k := range ks {
			why := pp.left[k]
			var sym *elfsym.Site
			if pp.ifuncs != nil {
				s := pp.ifuncs[k]
				sym = &s
			} else {
				s := pp.sel.Sites()[k]
				sym = &s
			}
			out = append(out, Site{
				Name: sym.Name, Offset: pp.offs[k], Probe: pp.probe, Path: pp.file.path,
				Moved: sym.Moved, Note: sym.Note, Symbol: sym, LeftOut: why,
			})
		}
	}
	return cloneSites(out)
}
