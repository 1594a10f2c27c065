package multiprobe_test

import (
	"fmt"
	"log"
	"os/exec"

	"github.com/cilium/ebpf"

	"github.com/multiprobe/multiprobe"
)

// Count calls to every function of bash whose name starts with "sh_", but
// not the sh_free* ones, in one bash process, with one program attached
// through one link per binary. The program (any object with a uprobe
// program that counts per bpf_get_attach_cookie, such as bpf2go output)
// is prepared for this kernel and these options before it is loaded.
func ExampleAttach() {
	probes, err := multiprobe.ParseProbes("uprobe:/bin/bash:sh_*,!sh_free*")
	if err != nil {
		log.Fatal(err)
	}
	cmd := exec.Command("/bin/bash", "-c", "read line; echo hi >/dev/null")
	stdin, _ := cmd.StdinPipe()
	if err := cmd.Start(); err != nil {
		log.Fatal(err)
	}
	opts := &multiprobe.Options{PID: cmd.Process.Pid}

	spec, err := ebpf.LoadCollectionSpec("counter.bpf.o")
	if err != nil {
		log.Fatal(err)
	}
	// The attach type for this kernel's path; the in-BPF pid filter where
	// the kernel cannot filter by pid itself.
	if err := multiprobe.Prepare(spec, opts); err != nil {
		log.Fatal(err)
	}
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		log.Fatal(err) // not root, or no BPF
	}
	defer coll.Close()
	opts.Maps = coll.Maps

	l, err := multiprobe.Attach(coll.Programs["count_entry"], probes, opts)
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	fmt.Printf("%d sites attached through %v\n", len(l.Sites()), l.Path())

	stdin.Write([]byte("go\n"))
	cmd.Wait()
	for _, s := range l.Sites() {
		var n uint64
		if err := coll.Maps["counts"].Lookup(uint32(s.Cookie), &n); err == nil && n > 0 {
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
