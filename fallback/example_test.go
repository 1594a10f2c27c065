package fallback_test

import (
	"fmt"
	"log"

	"github.com/cilium/ebpf"
	"github.com/multiprobe/multiprobe/attach"
	"github.com/multiprobe/multiprobe/fallback"
	"github.com/multiprobe/multiprobe/kernelprobe"
)

// Attach a program to two functions of a binary, one perf-event uprobe
// each, on a kernel without uprobe_multi. The program reads each site's
// cookie with bpf_get_attach_cookie (Linux 5.15+); on older kernels the
// root package's Plan.Attach gives every site a clone of the program
// instead (Options.Programs).
func ExampleUprobes() {
	features, err := kernelprobe.Detect()
	if err != nil {
		log.Fatal(err)
	}
	spec, err := ebpf.LoadCollectionSpec("probe.bpf.o")
	if err != nil {
		log.Fatal(err)
	}
	kernelprobe.PrepareCollectionSpec(spec, kernelprobe.PathPerfEvent)
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		log.Fatal(err)
	}
	defer coll.Close()

	l, err := fallback.Uprobes(coll.Programs["on_call"], []attach.Target{{
		Path:    "/usr/bin/app",
		Offsets: []uint64{0x1139, 0x1150},
		Cookies: []uint64{1, 2},
	}}, &fallback.Options{Features: &features})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	fmt.Println(l.Sites(), "sites,", l.NumFDs(), "file descriptors")
}
