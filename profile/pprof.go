package profile

import (
	"bufio"
	"compress/gzip"
	"fmt"
	"io"
	"strings"
)

// WritePprof writes s as a gzipped pprof profile (the protocol buffer of
// github.com/google/pprof/proto/profile.proto), which `go tool pprof`
// opens: each sample's stack is the program, then the BPF function and
// source line it ran, then the kernel function that line called where
// the time went there, with a count of samples and the CPU time they
// stand for. pprof's source view reads the files where the lines name
// them, relative to where the program was compiled.
func (s *Samples) WritePprof(w io.Writer) error {
	zw := gzip.NewWriter(w)
	if _, err := zw.Write(s.pprof()); err != nil {
		return fmt.Errorf("profile: writing pprof: %w", err)
	}
	if err := zw.Close(); err != nil {
		return fmt.Errorf("profile: writing pprof: %w", err)
	}
	return nil
}

// pprof encodes s as an uncompressed profile.proto message. The field
// numbers are profile.proto's.
func (s *Samples) pprof() []byte {
	var p pb
	strs := map[string]int64{"": 0}
	table := []string{""}
	str := func(v string) int64 {
		i, ok := strs[v]
		if !ok {
			i = int64(len(table))
			strs[v] = i
			table = append(table, v)
		}
		return i
	}
	valueType := func(typ, unit string) []byte {
		var m pb
		m.int(1, str(typ))
		m.int(2, str(unit))
		return m.b
	}
	p.bytes(1, valueType("samples", "count")) // sample_type
	p.bytes(1, valueType("cpu", "nanoseconds"))

	// Functions: the program itself (the root of every stack), then each
	// BPF function by name and file: a function's lines can be in several
	// files (a header's inlined function), and pprof takes a line's file
	// from its function.
	type fnKey struct{ name, file string }
	funcs := map[fnKey]uint64{}
	function := func(name, file string) uint64 {
		if id, ok := funcs[fnKey{name, file}]; ok {
			return id
		}
		id := uint64(len(funcs) + 1)
		funcs[fnKey{name, file}] = id
		var m pb
		m.uint(1, id)
		m.int(2, str(name))
		m.int(3, str(name))
		m.int(4, str(file))
		p.bytes(5, m.b)
		return id
	}
	// One mapping, the program's JIT image, so that pprof names it and
	// knows the functions and lines are already there.
	var m pb
	m.uint(1, 1)
	m.uint(2, s.start)
	m.uint(3, s.end)
	m.int(5, str("bpf_prog_"+s.Program))
	for field := 7; field <= 9; field++ { // has_functions, _filenames, _line_numbers
		m.uint(field, 1)
	}
	p.bytes(3, m.b)
	location := func(id, fn, addr uint64, line int) {
		var l pb
		l.uint(1, fn)
		l.int(2, int64(line))
		var m pb
		m.uint(1, id)
		m.uint(2, 1)
		m.uint(3, addr)
		m.bytes(4, l.b)
		p.bytes(4, m.b)
	}
	root := "bpf_prog " + s.Program
	location(1, function(root, ""), s.start, 0)
	nextID := uint64(2)
	callees := map[string]uint64{} // kernel function → its location
	sample := func(n uint64, locs ...uint64) {
		var m pb
		m.packed(1, locs...) // location_id, the leaf first
		m.packed(2, n, n*uint64(s.Period))
		p.bytes(2, m.b)
	}
	for _, l := range s.Lines {
		id := nextID
		nextID++
		location(id, function(l.Func, l.File), l.addr, l.Line)
		if l.Self > 0 {
			sample(l.Self, id, 1)
		}
		for _, c := range l.Callees {
			cid, ok := callees[c.Func]
			if !ok {
				cid = nextID
				nextID++
				callees[c.Func] = cid
				location(cid, function(c.Func, "[kernel]"), 0, 0)
			}
			sample(c.Samples, cid, id, 1)
		}
	}
	p.int(9, s.Start.UnixNano())                 // time_nanos
	p.int(10, int64(s.Duration))                 // duration_nanos
	p.bytes(11, valueType("cpu", "nanoseconds")) // period_type
	p.int(12, int64(s.Period))                   // period
	for _, v := range table {
		p.bytes(6, []byte(v)) // string_table, in order
	}
	return p.b
}

// pb appends protocol buffer fields.
type pb struct{ b []byte }

func (p *pb) varint(v uint64) {
	for v >= 0x80 {
		p.b = append(p.b, byte(v)|0x80)
		v >>= 7
	}
	p.b = append(p.b, byte(v))
}

func (p *pb) uint(field int, v uint64) {
	if v == 0 {
		return // the default, as proto3 leaves it out
	}
	p.varint(uint64(field) << 3)
	p.varint(v)
}

func (p *pb) int(field int, v int64) { p.uint(field, uint64(v)) }

func (p *pb) bytes(field int, v []byte) {
	p.varint(uint64(field)<<3 | 2)
	p.varint(uint64(len(v)))
	p.b = append(p.b, v...)
}

func (p *pb) packed(field int, vs ...uint64) {
	var m pb
	for _, v := range vs {
		m.varint(v)
	}
	p.bytes(field, m.b)
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
