package attach_test

import (
	"fmt"
	"log"

	"github.com/cilium/ebpf"
	"github.com/multiprobe/multiprobe/attach"
	"github.com/multiprobe/multiprobe/kernelprobe"
)

// Attach one entry program to three functions of a binary through one
// uprobe_multi link. The program reads the site's cookie (here 0, 1, 2) with
// bpf_get_attach_cookie(). Needs root and Linux 6.6+.
func ExampleUprobeMulti() {
	spec, err := ebpf.LoadCollectionSpec("probes.o")
	if err != nil {
		log.Fatal(err)
	}
	kernelprobe.PrepareCollectionSpec(spec, kernelprobe.PathUprobeMulti)
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		log.Fatal(err)
	}
	defer coll.Close()

	l, err := attach.UprobeMulti(coll.Programs["count_entry"], []attach.Target{{
		Path:    "/usr/bin/bash",
		Offsets: []uint64{0x31f40, 0x32010, 0x4a7e0}, // file offsets, from package elfsym
		Names:   []string{"main", "shell_initialize", "execute_command"},
	}}, &attach.Options{})
	if err != nil {
		log.Fatal(err) // names the binary, the site and the kernel's errno
	}
	defer l.Close()

	infos, err := l.Info()
	if err != nil {
		log.Fatal(err)
	}
	for _, in := range infos {
		fmt.Printf("link %d on %s: %d sites, cookies %v\n", in.ID, in.Path, len(in.Offsets), in.Cookies)
	}
}
