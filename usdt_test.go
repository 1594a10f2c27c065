package multiprobe_test

import (
	"bufio"
	"fmt"
	"io"
	"os/exec"
	"testing"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/testprogs"
	"github.com/multiprobe/multiprobe/usdt"
)

// TestUSDT attaches a program to every USDT probe of a target through one
// link and checks, per site, the hits and the argument values the BPF side
// read, the semaphore-guarded probe (which fires only while the kernel
// holds its semaphore up), and the release of spec ids on Close.
func TestUSDT(t *testing.T) {
	forEachPath(t, func(t *testing.T, f kernelprobe.Features) {
		testUSDT(t, f, false)
	})
	// Without BPF cookies the program finds each site's spec through the
	// address map: forced on the kernel's own path.
	t.Run("no cookies", func(t *testing.T) {
		f := paths(t)[0]
		f.Cookies = false
		testUSDT(t, f, true)
	})
}

func testUSDT(t *testing.T, f kernelprobe.Features, noCookie bool) {
	const n = 40

	target := testprogs.USDTTarget(t)

	// Without cookies the probed address is looked up, so a PIE target
	// needs the pid of the process, started waiting.
	cmd := exec.Command(target, "-wait", fmt.Sprint(n))
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	out := bufio.NewReader(stdout)
	if line, _ := out.ReadString('\n'); line != "ready\n" {
		cmd.Process.Kill()
		t.Fatalf("target said %q", line)
	}

	// The pid is known before the load, so that Prepare can give the
	// program the in-BPF pid filter where the kernel cannot filter.
	opts := &multiprobe.Options{PID: cmd.Process.Pid, Features: &f}
	spec, err := testprogs.USDTCounterSpec()
	if err != nil {
		t.Fatal(err)
	}
	if err := multiprobe.Prepare(spec, opts); err != nil {
		t.Fatal(err)
	}
	if noCookie {
		// Prepare sets the address lookup up only for kernels it finds
		// without cookies; here they are forced off on the multi path.
		if err := usdt.ConfigureCollection(spec, usdt.CollectionOptions{NoCookie: true}); err != nil {
			t.Fatal(err)
		}
	}
	c, err := testprogs.NewUSDTCounter(spec)
	if err != nil {
		cmd.Process.Kill()
		t.Fatal(err)
	}
	defer c.Close()
	opts.Maps = c.Maps
	before := testutil.TakeSnapshot(t, c.CountUSDT)
	l, err := multiprobe.Attach(c.CountUSDT, mustParse(t, "usdt:"+target+":mp:*"), opts)
	if l != nil {
		checkPath(t, l, f)
	}
	if err != nil {
		cmd.Process.Kill()
		t.Fatal(err)
	}
	stdin.Write([]byte("go\n"))
	stdin.Close()
	rest, _ := io.ReadAll(out)
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("done %d\n", n); string(rest) != want {
		t.Errorf("target said %q, want %q: the guarded probe's semaphore was not set while attached", rest, want)
	}

	sites := l.Sites()
	if len(sites) != 2+testprogs.USDTInlinedSites {
		t.Fatalf("%d sites, want %d", len(sites), 2+testprogs.USDTInlinedSites)
	}
	hits, _ := testprogs.ReadInt64s(c.Hits, len(sites))
	argc, _ := testprogs.ReadInt64s(c.Argc, len(sites))
	sum0, _ := testprogs.ReadInt64s(c.Sum0, len(sites))
	sum1, _ := testprogs.ReadInt64s(c.Sum1, len(sites))
	sumI := int64(n * (n - 1) / 2)
	for i, s := range sites {
		var want [4]int64 // hits, argc, sum0, sum1
		switch s.Name {
		case "mp:tick":
			want = [4]int64{n, 2 * n, sumI, -3 * sumI}
		case "mp:guarded":
			want = [4]int64{n, n, sumI, 0}
		case "mp:inlined":
			want = [4]int64{1, 1, n, 0}
		default:
			t.Fatalf("unexpected site %s", s.Name)
		}
		if got := [4]int64{hits[i], argc[i], sum0[i], sum1[i]}; got != want {
			t.Errorf("%s at %#x: hits, argc, sum0, sum1 = %v, want %v", s.Name, s.Offset, got, want)
		}
		if s.Name == "mp:guarded" && s.RefCtrOffset == 0 {
			t.Errorf("mp:guarded has no semaphore offset")
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	// The child's pipes closed meanwhile: check the links, and that the
	// Link holds no fd.
	before.CheckLinks(t, "after Close")
	if n := l.FDs(); n != 0 {
		t.Errorf("%d fds held after Close", n)
	}
	// Close removed the sites' addresses from the address map.
	var next uint64
	if err := c.IPs.NextKey(nil, &next); err == nil {
		t.Errorf("address map still has entries after Close (key %#x)", next)
	}
}
