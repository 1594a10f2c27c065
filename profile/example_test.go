package profile_test

import (
	"fmt"
	"log"
	"os"
	"time"

	"github.com/cilium/ebpf"

	"github.com/multiprobe/multiprobe/profile"
)

// A program of the caller's own, loaded with BTF (bpf2go output or
// ebpf.NewCollection), measured for ten seconds where it runs.
func ExampleNewMeter() {
	var prog *ebpf.Program // e.g. objs.MyProbe, attached and running
	m, err := profile.NewMeter(prog)
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	time.Sleep(10 * time.Second)
	c, err := m.Read()
	if err != nil {
		log.Fatal(err)
	}
	o, err := profile.MeasureOverhead()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s: %d runs, mean %v, p50 %v, p99 %v (the meter reads %v more, and adds %v to each run)\n",
		m.Function(), c.Runs, c.Mean(), c.Percentile(0.5), c.Percentile(0.99), o.Reading, o.PerRun)
	if c.Cycles.Present() {
		fmt.Printf("%.0f cycles, %.0f instructions per run\n", c.Cycles.PerRun(), c.Instructions.PerRun())
	}
}

// Where a program of the caller's own spends its time, by source line,
// sampled for ten seconds, and the same as a pprof profile.
func ExampleNewSampler() {
	var prog *ebpf.Program // e.g. objs.MyProbe, attached and running
	s, err := profile.NewSampler(prog, profile.SampleOptions{Frequency: 999})
	if err != nil {
		log.Fatal(err) // profile.ErrNoLineInfo without BTF
	}
	defer s.Close()
	time.Sleep(10 * time.Second)
	if err := s.Close(); err != nil {
		log.Fatal(err)
	}
	samples := s.Samples()
	for _, l := range samples.Lines {
		fmt.Printf("%6d %5.1f%% %s %s\n", l.Samples, 100*float64(l.Samples)/float64(samples.Total), l, l.Source)
	}
	f, err := os.Create("prog.pb.gz") // go tool pprof -http=: prog.pb.gz
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	if err := samples.WritePprof(f); err != nil {
		log.Fatal(err)
	}
}
