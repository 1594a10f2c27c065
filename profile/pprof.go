package profile

import (
	"bufio"
	"fmt"
	"io"
	"strings"

	pprof "github.com/google/pprof/profile"
)

// WritePprof writes s as a gzipped pprof profile, which `go tool pprof`
// opens: each sample's stack is the program, then the BPF function and
// source line it ran, then the kernel function that line called where
// the time went there, with a count of samples and the CPU time they
// stand for. pprof's source view reads the files where the lines name
// them, relative to where the program was compiled. The profile is built
// and checked with pprof's own package before it is written.
func (s *Samples) WritePprof(w io.Writer) error {
	p := s.pprof()
	if err := p.CheckValid(); err != nil {
		return fmt.Errorf("profile: pprof profile of %s: %w", s.Program, err)
	}
	if err := p.Write(w); err != nil {
		return fmt.Errorf("profile: writing pprof: %w", err)
	}
	return nil
}

// pprof builds s as a pprof profile.
func (s *Samples) pprof() *pprof.Profile {
	p := &pprof.Profile{
		SampleType:    []*pprof.ValueType{{Type: "samples", Unit: "count"}, {Type: "cpu", Unit: "nanoseconds"}},
		PeriodType:    &pprof.ValueType{Type: "cpu", Unit: "nanoseconds"},
		Period:        int64(s.Period),
		TimeNanos:     s.Start.UnixNano(),
		DurationNanos: int64(s.Duration),
	}
	// One mapping, the program's JIT image, so that pprof names it and
	// knows the functions and lines are already there.
	image := &pprof.Mapping{ID: 1, Start: s.start, Limit: s.end, File: "bpf_prog_" + s.Program,
		HasFunctions: true, HasFilenames: true, HasLineNumbers: true}
	p.Mapping = []*pprof.Mapping{image}

	// Functions: the program itself (the root of every stack), then each
	// BPF function by name and file: a function's lines can be in several
	// files (a header's inlined function), and pprof takes a line's file
	// from its function.
	type fnKey struct{ name, file string }
	funcs := map[fnKey]*pprof.Function{}
	function := func(name, file string) *pprof.Function {
		if f, ok := funcs[fnKey{name, file}]; ok {
			return f
		}
		f := &pprof.Function{ID: uint64(len(p.Function) + 1), Name: name, SystemName: name, Filename: file}
		funcs[fnKey{name, file}] = f
		p.Function = append(p.Function, f)
		return f
	}
	location := func(fn *pprof.Function, addr uint64, line int) *pprof.Location {
		l := &pprof.Location{ID: uint64(len(p.Location) + 1), Mapping: image, Address: addr,
			Line: []pprof.Line{{Function: fn, Line: int64(line)}}}
		p.Location = append(p.Location, l)
		return l
	}
	sample := func(n uint64, stack ...*pprof.Location) { // the leaf first
		p.Sample = append(p.Sample, &pprof.Sample{Location: stack, Value: []int64{int64(n), int64(n) * int64(s.Period)}})
	}
	root := location(function("bpf_prog "+s.Program, ""), s.start, 0)
	callees := map[string]*pprof.Location{} // kernel function → its location
	for _, l := range s.Lines {
		line := location(function(l.Func, l.File), l.addr, l.Line)
		if l.Self > 0 {
			sample(l.Self, line, root)
		}
		for _, c := range l.Callees {
			callee, ok := callees[c.Func]
			if !ok {
				callee = location(function(c.Func, "[kernel]"), 0, 0)
				callees[c.Func] = callee
			}
			sample(c.Samples, callee, line, root)
		}
	}
	return p
}

// WriteFolded writes s as folded stacks, as flame graph tools read them:
// "program;function;file:line count" for a line's own code, and
// "program;function;file:line;kernel_function count" for what it called.
func (s *Samples) WriteFolded(w io.Writer) error {
	bw := bufio.NewWriter(w)
	for _, l := range s.Lines {
		stack := folded(s.Program) + ";" + folded(l.Func) + ";" + folded(l.String())
		if l.Self > 0 {
			fmt.Fprintf(bw, "%s %d\n", stack, l.Self)
		}
		for _, c := range l.Callees {
			fmt.Fprintf(bw, "%s;%s %d\n", stack, folded(c.Func), c.Samples)
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("profile: writing folded stacks: %w", err)
	}
	return nil
}

// folded keeps the separators of the folded format out of a frame.
func folded(frame string) string {
	return strings.NewReplacer(";", ":", " ", "_", "\n", "_").Replace(frame)
}
