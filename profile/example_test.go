package profile_test

import (
	"fmt"
	"log"
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
