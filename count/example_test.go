package count_test

import (
	"fmt"
	"log"
	"os/exec"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/count"
)

// Count calls to bash's memory allocator in one bash process, as bcc's
// funccount does: no BPF C, no clang.
func ExampleAttach() {
	probes, err := multiprobe.ParseProbes("uprobe:/bin/bash:xmalloc,xfree")
	if err != nil {
		log.Fatal(err)
	}
	// A bash that waits for a line before it runs its command, so that
	// the probes are in place first.
	cmd := exec.Command("/bin/bash", "-c", "read line; for i in 1 2 3; do echo $i; done >/dev/null")
	stdin, _ := cmd.StdinPipe()
	if err := cmd.Start(); err != nil {
		log.Fatal(err)
	}
	defer cmd.Wait()
	plan, err := multiprobe.Resolve(probes, &multiprobe.Options{PIDs: []int{cmd.Process.Pid}})
	if err != nil {
		log.Fatal(err)
	}
	defer plan.Close()

	c, err := count.Attach(plan, nil)
	if err != nil {
		log.Fatal(err) // not root, or no BPF
	}
	defer c.Close()

	stdin.Write([]byte("go\n"))
	stdin.Close()
	cmd.Wait()
	snap, err := c.Snapshot()
	if err != nil {
		log.Fatal(err)
	}
	for _, s := range snap.Sites {
		fmt.Println(s.Site.Name, "called:", s.Calls > 0)
	}
	// Output:
	// xmalloc called: true
	// xfree called: true
}

// Count by process: which processes call a function, and how often.
func ExampleOptions_by() {
	probes, err := multiprobe.ParseProbes("uprobe:/bin/bash:xmalloc")
	if err != nil {
		log.Fatal(err)
	}
	plan, err := multiprobe.Resolve(probes, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer plan.Close()
	c, err := count.Attach(plan, &count.Options{By: count.ByProcess})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	cmd := exec.Command("/bin/bash", "-c", "echo hello >/dev/null")
	if err := cmd.Run(); err != nil {
		log.Fatal(err)
	}
	snap, err := c.Snapshot()
	if err != nil {
		log.Fatal(err)
	}
	for _, b := range snap.By {
		if b.Who == uint64(cmd.Process.Pid) {
			fmt.Println(snap.Sites[b.Site].Site.Name, "called by the bash run:", b.Calls > 0)
		}
	}
	// Output:
	// xmalloc called by the bash run: true
}
