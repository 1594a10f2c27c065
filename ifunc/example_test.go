package ifunc_test

import (
	"bufio"
	"fmt"
	"log"
	"os/exec"

	"github.com/multiprobe/multiprobe/elfsym"
	"github.com/multiprobe/multiprobe/ifunc"
)

// Find strlen's implementation in a running process's libc, as that
// process's loader chose it, without running any of libc's code. (Not run
// by go test: where cat is busybox's, as in the test VMs, it maps no libc.
// TestSitesInRoot checks ResolveIn.)
func ExampleResolveIn() {
	libc, err := elfsym.LookPath("libc.so.6")
	if err != nil {
		log.Fatal(err)
	}
	sites, err := elfsym.Resolve(libc, "strlen")
	if err != nil {
		log.Fatal(err)
	}
	// cat echoes a line once its loader has relocated libc.
	cmd := exec.Command("cat")
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		log.Fatal(err)
	}
	defer func() { in.Close(); cmd.Wait() }()
	fmt.Fprintln(in, "ready")
	if _, err := bufio.NewReader(out).ReadString('\n'); err != nil {
		log.Fatal(err)
	}

	impls, err := ifunc.ResolveIn(cmd.Process.Pid, libc, []uint64{sites[0].Address})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("strlen's resolver %#x chose %#x\n", sites[0].Address, impls[0])
}
