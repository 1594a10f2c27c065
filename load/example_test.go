package load_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/cilium/ebpf"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/load"
)

// Load an agent's programs concurrently, ordered by the costs the previous
// start measured, with its uprobe programs set up for uprobe_multi links.
func ExampleCollection() {
	spec, err := ebpf.LoadCollectionSpec("agent.bpf.o")
	if err != nil {
		log.Fatal(err)
	}
	// The uprobe path (uprobe_multi or perf events) is decided before the
	// load; kernelprobe tells which one this kernel supports.
	features, err := kernelprobe.Detect()
	if err != nil {
		log.Fatal(err)
	}
	path := features.Path()
	opts := &load.Options{AttachType: func(_ string, spec *ebpf.ProgramSpec) ebpf.AttachType {
		return kernelprobe.AttachType(spec, path)
	}}
	if costs, err := load.OpenCostCache(""); err == nil {
		opts.Costs, opts.Order = costs, load.OrderCached
	}
	coll, prof, err := load.Collection(spec, opts)
	var lerr *load.Error
	if errors.As(err, &lerr) {
		// Every failed program, in a stable order, the first with its
		// whole verifier log.
		log.Fatal(lerr)
	}
	if err != nil {
		log.Fatal(err)
	}
	defer coll.Close()
	fmt.Printf("%d programs verified in %v (lower bound %v, %.2fx faster than one by one)\n",
		len(coll.Programs), prof.Makespan, prof.LowerBound, prof.Speedup())
}
