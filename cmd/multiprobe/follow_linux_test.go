package main

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/probetest"
)

// TestCountFollowContainers: 500 short-lived containers of one image
// (each chrooted into it, in a mount namespace of its own, so all run
// its one file) keep --json to one files entry, and the program's main
// counts once a container.
func TestCountFollowContainers(t *testing.T) {
	probetest.RequireBPF(t)
	testutil.SkipOnMTTCG(t)
	const containers = 500
	prog := filepath.Join(t.TempDir(), "boxed")
	data, err := os.ReadFile(testprogs.MallocsTarget(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(prog, data, 0o755); err != nil {
		t.Fatal(err)
	}
	image := testprogs.ContainerRoot(t, prog)
	cmd, out, stderr := startCLI(t, "count", "--json", "-v", "--duration", "120", "uprobe:boxed:main")
	attached := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		once := false
		for sc.Scan() {
			if !once && strings.HasPrefix(sc.Text(), "attached /bin/boxed ") {
				once = true
				close(attached)
			}
		}
	}()
	for i := range containers {
		c := testprogs.ContainerCommand(image, "boxed", "-wait", "0", "0")
		in, err := c.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		outp, err := c.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			select {
			case <-attached:
			case <-time.After(20 * time.Second):
				t.Fatal("the first container's file was not attached")
			}
		}
		in.Write([]byte("\n"))
		in.Close()
		io.Copy(io.Discard, outp)
		if err := c.Wait(); err != nil {
			t.Fatalf("container %d: %v", i, err)
		}
	}
	cmd.Process.Signal(os.Interrupt)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("count: %v", err)
	}
	var r countReport
	if err := json.Unmarshal([]byte(out.String()), &r); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	// The processes are those the watch saw: a container that exits
	// before the watch reads its maps is not among them, though its
	// calls count (its file is attached).
	if len(r.Files) != 1 || r.Files[0].Path != "/bin/boxed" || r.Files[0].Processes < 1 || r.Files[0].Processes > containers+1 {
		t.Fatalf("files %+v, want one: /bin/boxed, mapped by up to the %d containers", r.Files, containers)
	}
	// The first container's main runs as its file appears, before the
	// watch has attached it (a millisecond later): it may be missed.
	if len(r.Probes) != 1 || len(r.Counts) != 1 || r.Counts[0].Calls < containers-1 || r.Counts[0].Calls > containers {
		t.Errorf("probes %q, counts %+v: want the one spec, main called %d times (the first may be missed)", r.Probes, r.Counts, containers)
	}
	t.Logf("1 file entry after %d containers, %d processes seen mapping it", containers, r.Files[0].Processes)
}
