package multiprobe_test

import (
	"testing"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/probetest"
)

// TestDescendants: with Options.Descendants, the calls of the processes
// that the chosen one makes count too (a shell runs the target twice, in
// a pipeline and under timeout), and a process outside counts nothing.
// On both paths.
func TestDescendants(t *testing.T) {
	forEachPath(t, func(t *testing.T, f kernelprobe.Features) {
		const n, calls = 20, 2 // (a size the VM runner prebuilds)
		target := testprogs.PrivateTarget(t, n)
		sh := probetest.StartStopped(t, "/bin/sh", "-c", target+" 2 | cat >/dev/null; timeout 10 "+target+" 2 >/dev/null")
		c, plans := setup(t, f, multiprobe.Options{PID: sh.PID(), Descendants: true}, []string{"uprobe:" + target + ":func_*"})
		l := mustAttach(t, plans[0], c.CountEntry)
		checkPath(t, l, f)
		if err := sh.Resume(); err != nil {
			t.Fatal(err)
		}
		runTarget(t, target, calls) // not a descendant
		if status, err := sh.Wait(); err != nil || status != 0 {
			t.Fatalf("the shell: status %d, %v", status, err)
		}
		counts, err := testprogs.ReadArray(c.Counts, n)
		if err != nil {
			t.Fatal(err)
		}
		for cookie, s := range l.Sites() {
			if want := uint64(2 * testprogs.ExpectedCalls(funcIndex(t, s.Name), calls)); counts[cookie] != want {
				t.Errorf("%s: %d calls counted, want %d (the shell's two children's)", s.Name, counts[cookie], want)
			}
		}
	})
}
