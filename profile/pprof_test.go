package profile

import (
	"bytes"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	pprof "github.com/google/pprof/profile"
)

// TestWritePprof writes samples of two lines of one function, each also
// in a helper, and reads them back with pprof's own parser: every stack is
// the program, the line, then the helper, with its samples and CPU time.
func TestWritePprof(t *testing.T) {
	s := &Samples{
		Program: "count", Period: time.Millisecond, Start: time.Unix(1700000000, 0), Duration: 2 * time.Second,
		start: 0x1000, end: 0x2000,
		Lines: []Line{
			{Func: "count", File: "count.c", Line: 10, Self: 5, addr: 0x1010,
				Callees: []Callee{{Func: "bpf_map_lookup_elem", Samples: 3}}},
			{Func: "count", File: "mp_cookie.bpf.h", Line: 40, Self: 2, addr: 0x1020,
				Callees: []Callee{{Func: "bpf_map_lookup_elem", Samples: 1}}},
		},
	}
	var buf bytes.Buffer
	if err := s.WritePprof(&buf); err != nil {
		t.Fatal(err)
	}
	p, err := pprof.Parse(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.CheckValid(); err != nil {
		t.Fatal(err)
	}
	if got := []string{p.SampleType[0].Type, p.SampleType[1].Type, p.SampleType[1].Unit}; !slices.Equal(got, []string{"samples", "cpu", "nanoseconds"}) {
		t.Errorf("sample types %q", got)
	}
	if p.Period != int64(time.Millisecond) || p.DurationNanos != int64(2*time.Second) || p.TimeNanos != s.Start.UnixNano() {
		t.Errorf("period %d, duration %d, time %d", p.Period, p.DurationNanos, p.TimeNanos)
	}
	var stacks []string
	for _, smp := range p.Sample {
		var frames []string
		for _, l := range smp.Location {
			ln := l.Line[0]
			frames = append(frames, ln.Function.Name+"@"+ln.Function.Filename+":"+itoa(ln.Line))
		}
		stacks = append(stacks, strings.Join(frames, " < ")+" = "+itoa(smp.Value[0])+", "+itoa(smp.Value[1]))
	}
	want := []string{
		"count@count.c:10 < bpf_prog count@:0 = 5, 5000000",
		"bpf_map_lookup_elem@[kernel]:0 < count@count.c:10 < bpf_prog count@:0 = 3, 3000000",
		"count@mp_cookie.bpf.h:40 < bpf_prog count@:0 = 2, 2000000",
		"bpf_map_lookup_elem@[kernel]:0 < count@mp_cookie.bpf.h:40 < bpf_prog count@:0 = 1, 1000000",
	}
	if !slices.Equal(stacks, want) {
		t.Errorf("stacks:\n%s\nwant:\n%s", strings.Join(stacks, "\n"), strings.Join(want, "\n"))
	}
	// A kernel function is one location however many lines call it; a
	// function is one per file.
	if len(p.Location) != 4 || len(p.Function) != 4 {
		t.Errorf("%d locations, %d functions; want 4 and 4", len(p.Location), len(p.Function))
	}
	if len(p.Mapping) != 1 || p.Mapping[0].File != "bpf_prog_count" || !p.Mapping[0].HasFunctions {
		t.Errorf("mappings %v", p.Mapping)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
