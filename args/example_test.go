package args_test

import (
	"errors"
	"fmt"
	"log"
	"os/exec"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/args"
)

// Which variables a bash looks up: find_variable's first argument, read
// as a C string at each call, as bpftrace's printf("%s", str(arg0)).
func ExampleAttach() {
	probes, err := multiprobe.ParseProbes("uprobe:/bin/bash:find_variable")
	if err != nil {
		log.Fatal(err)
	}
	plan, err := multiprobe.Resolve(probes, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer plan.Close()
	t, err := args.Attach(plan, &args.Options{Args: 1, Strings: []int{0}})
	if err != nil {
		log.Fatal(err) // not root, or no BPF
	}
	defer t.Close()

	if err := exec.Command("/bin/bash", "-c", "echo $MULTIPROBE_EXAMPLE >/dev/null").Run(); err != nil {
		log.Fatal(err)
	}
	t.Flush() // the hits buffered now, then ErrFlushed
	seen := false
	for {
		h, err := t.Read()
		if errors.Is(err, args.ErrFlushed) {
			break
		}
		if err != nil {
			log.Fatal(err)
		}
		seen = seen || h.Strings[0] == "MULTIPROBE_EXAMPLE"
	}
	fmt.Println("find_variable(\"MULTIPROBE_EXAMPLE\") seen:", seen)
	// Output:
	// find_variable("MULTIPROBE_EXAMPLE") seen: true
}
