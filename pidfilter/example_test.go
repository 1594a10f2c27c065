package pidfilter_test

import (
	"log"

	"github.com/cilium/ebpf"
	"github.com/multiprobe/multiprobe/pidfilter"
)

// Restrict a program to two processes, then to a third one while it stays
// attached.
func ExampleInject() {
	spec, err := ebpf.LoadCollectionSpec("probe.bpf.o")
	if err != nil {
		log.Fatal(err)
	}
	if err := pidfilter.Inject(spec, "on_call"); err != nil {
		log.Fatal(err)
	}
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		log.Fatal(err)
	}
	defer coll.Close()
	filter, err := pidfilter.FromCollection(coll)
	if err != nil {
		log.Fatal(err)
	}
	defer filter.Close()
	if err := filter.Acquire(1234, 5678); err != nil {
		log.Fatal(err)
	}
	// ... attach coll.Programs["on_call"] ...
	if err := filter.Replace([]int{1234, 5678}, []int{4321}); err != nil {
		log.Fatal(err)
	}
}
