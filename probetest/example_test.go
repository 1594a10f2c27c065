package probetest_test

import (
	"testing"

	"github.com/cilium/ebpf"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/probetest"
)

// testCountWork is a test of a tool that counts calls: spec is its BPF
// object (from bpf2go's loadXxx), with a program count_entry that adds 1
// to counts[mp_cookie(ctx)] (see CheckCounts). It builds the C target,
// starts it stopped, attaches with its pid as the filter, lets it run, and
// compares the counts by site name.
func testCountWork(t *testing.T, spec *ebpf.CollectionSpec) {
	probetest.RequireBPF(t) // skips locally, fails under CI=true
	target := probetest.BuildC(t, probetest.CBuild{Name: "work", Sources: map[string][]byte{"work.c": []byte(
		`__attribute__((noipa)) int work(int x) { return x + 1; }
		int main(void) { for (int i = 0; i < 3; i++) work(i); return 0; }`)}})
	p := probetest.StartStopped(t, target)
	probes, _ := multiprobe.ParseProbes("uprobe:" + target + ":work")
	plan, err := multiprobe.Resolve(probes, &multiprobe.Options{PID: p.PID()})
	if err != nil {
		t.Fatal(err)
	}
	defer plan.Close()
	if err := plan.Prepare(spec); err != nil { // before loading: older kernels filter pids in BPF
		t.Fatal(err)
	}
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(coll.Close) // after CheckLeaks' check
	probetest.CheckLeaks(t, coll.Programs["count_entry"])
	l, err := plan.Attach(coll.Programs["count_entry"])
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := p.Resume(); err != nil {
		t.Fatal(err)
	}
	if status, err := p.Wait(); status != 0 {
		t.Fatalf("work exited with %d (%v)", status, err)
	}
	probetest.CheckCounts(t, plan.Sites(), coll.Maps["counts"], map[string]uint64{"work": 3})
}

// A test of a tool that counts calls, from the C target's build to the
// counts by site name.
func Example() {
	_ = testCountWork
}
