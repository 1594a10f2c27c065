package latency_test

import (
	"fmt"
	"log"
	"os/exec"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/latency"
)

// Time bash's memory allocator while a bash runs, as bcc's funclatency
// does: no BPF C, no clang. Each function's histogram counts its calls by
// how long they took, slot i from 2^i to 2^(i+1) nanoseconds.
func ExampleAttach() {
	probes, err := multiprobe.ParseProbes("uprobe:/bin/bash:xmalloc")
	if err != nil {
		log.Fatal(err)
	}
	plan, err := latency.Resolve(probes, nil) // sessions on Linux 6.13+, else entry and return probes
	if err != nil {
		log.Fatal(err)
	}
	defer plan.Close()
	t, err := latency.Attach(plan, nil)
	if err != nil {
		log.Fatal(err) // not root, or no BPF
	}
	defer t.Close()

	if err := exec.Command("/bin/bash", "-c", "for i in 1 2 3; do echo $i; done >/dev/null").Run(); err != nil {
		log.Fatal(err)
	}
	snap, err := t.Snapshot()
	if err != nil {
		log.Fatal(err)
	}
	for _, f := range snap.Functions {
		fmt.Println(f.Site.Name, "timed:", f.Count > 0, "under a millisecond on average:", f.Count > 0 && f.SumNs/f.Count < 1e6)
	}
	// Output:
	// xmalloc timed: true under a millisecond on average: true
}
