package multiprobe_test

import (
	"fmt"
	"log"
	"os/exec"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/testprogs"
)

// Count calls to every function of a binary whose name starts with "sh_",
// but not the sh_free* ones, with one program attached through one link.
// The program counts per BPF cookie, and each site's cookie is its index.
func ExampleAttach() {
	f, err := kernelprobe.Detect()
	if err != nil {
		log.Fatal(err) // not root, or no BPF
	}
	// A counter program, loaded for the path this kernel supports (see
	// kernelprobe.PrepareCollectionSpec for your own bpf2go objects).
	counter, err := testprogs.LoadCounter(f.Path())
	if err != nil {
		log.Fatal(err)
	}
	defer counter.Close()

	probes, err := multiprobe.ParseProbes("uprobe:/bin/bash:sh_*,!sh_free*")
	if err != nil {
		log.Fatal(err)
	}
	l, err := multiprobe.Attach(counter.CountEntry, probes, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()

	exec.Command("/bin/bash", "-c", "echo hi >/dev/null").Run()

	for _, s := range l.Sites() {
		var n uint64
		if err := counter.Counts.Lookup(uint32(s.Cookie), &n); err == nil && n > 0 {
			fmt.Println(s.Name, n)
		}
	}
}

// Parse bpftrace-style specs.
func ExampleParseProbe() {
	p, err := multiprobe.ParseProbe("uretprobe:libc.so.6:malloc,calloc,!*_chk")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(p.Kind, p.Target, p.Patterns)
	// Output: uretprobe libc.so.6 [malloc calloc !*_chk]
}
