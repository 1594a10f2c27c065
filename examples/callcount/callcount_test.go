package callcount_test

import (
	"testing"

	"example.com/callcount"
	"github.com/multiprobe/multiprobe/probetest"
)

const workC = `
__attribute__((noipa)) int work(int x) { return x + 1; }
__attribute__((noipa)) int rest(int x) { return x - 1; }
int main(void) {
	int s = 0;
	for (int i = 0; i < 5; i++)
		s += work(i);
	return rest(s) == 14 ? 0 : 1;
}
`

func TestCount(t *testing.T) {
	probetest.RequireBPF(t)
	target := probetest.BuildC(t, probetest.CBuild{Name: "work", Sources: map[string][]byte{"work.c": []byte(workC)}})
	probetest.CheckLeaks(t) // the Counter closes all it opened
	p := probetest.StartStopped(t, target)
	c, err := callcount.Start(p.PID(), "uprobe:"+target+":work,rest", "uretprobe:"+target+":rest")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := p.Resume(); err != nil {
		t.Fatal(err)
	}
	if status, err := p.Wait(); status != 0 {
		t.Fatalf("target exited with %d (%v)", status, err)
	}
	probetest.CheckCounts(t, c.Sites(), c.Counts(), map[string]uint64{
		"work":           5,
		"uprobe:rest":    1,
		"uretprobe:rest": 1,
	})
}

func TestBadSpec(t *testing.T) {
	probetest.RequireBPF(t)
	probetest.CheckLeaks(t)
	if _, err := callcount.Start(0, "uprobe:/bin/sh:no_such_function_anywhere"); err == nil {
		t.Fatal("no error for a spec that selects nothing")
	}
}
