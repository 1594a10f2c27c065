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
)

// TestUSDT attaches a program to every USDT probe of a target through one
// link and checks, per site, the hits and the argument values the BPF side
// read, the semaphore-guarded probe (which fires only while the kernel
// holds its semaphore up), and the release of spec ids on Close.
func TestUSDT(t *testing.T) {
	testutil.RequireBPF(t)
	f, err := kernelprobe.Detect()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		noCookie bool
	}{
		{"cookies", false},
		{"no cookies", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			features := f
			features.Cookies = !tc.noCookie && f.Cookies
			testUSDT(t, features, tc.noCookie)
		})
	}
}

func testUSDT(t *testing.T, f kernelprobe.Features, noCookie bool) {
	const n = 40
	c, err := testprogs.LoadUSDTCounter(f.Path(), noCookie)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	target := testprogs.USDTTarget(t)
	before := testutil.TakeSnapshot(t, c.CountUSDT)

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

	l, err := multiprobe.Attach(c.CountUSDT, mustParse(t, "usdt:"+target+":mp:*"), &multiprobe.Options{
		PID: cmd.Process.Pid, Features: &f, USDTSpecs: c.Specs, USDTIPs: c.IPs,
	})
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
	before.Check(t, "after Close")
	// Close removed the sites' addresses from the address map.
	var next uint64
	if err := c.IPs.NextKey(nil, &next); err == nil {
		t.Errorf("address map still has entries after Close (key %#x)", next)
	}
}
