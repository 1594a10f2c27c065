package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/multiprobe/multiprobe/probetest"
)

// BenchmarkListProcess runs whole processes side by side, in turn, on a
// big real binary: multiprobe list, a debug/elf program that decodes every
// symbol and matches each name (testdata/debugelf), and the floor, a
// process that only maps the file and touches every page of its symbol
// and string tables (testdata/floor). It reports each one's time per run
// and the ratios, multiprobe over the floor and debug/elf over
// multiprobe.
//
// It also starts multiprobe and the floor with nothing to do ("help", and
// the floor on its own small binary), and reports the start-ups and the
// ratio of what is left, the lookup itself: mp-work/floor-work. The
// whole-process ratio moves with the machine: where page faults and
// process start-up are cheap, the floor is a few milliseconds and the
// start-up of multiprobe's bigger binary weighs more. The work ratio says
// whether the lookup itself is at the floor.
//
//	go test -run='^$' -bench=ListProcess -benchtime=20x -count=10 ./cmd/multiprobe | tee /tmp/l.txt; benchstat /tmp/l.txt
//
// The binary is $MULTIPROBE_BIG_BINARY, else /usr/bin/node (98 MB, 185k
// symbols on Debian), and the pattern uv_*.
func BenchmarkListProcess(b *testing.B) {
	big := os.Getenv("MULTIPROBE_BIG_BINARY")
	if big == "" {
		big = "/usr/bin/node"
	}
	if _, err := os.Stat(big); err != nil {
		probetest.Unavailable(b, "no big binary to list: %v (set MULTIPROBE_BIG_BINARY)", err)
	}
	dir := b.TempDir()
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	build := func(name, pkg string) string {
		out := filepath.Join(dir, name)
		cmd := exec.Command(gobin, "build", "-o", out, pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if msg, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("go build %s: %v\n%s", pkg, err, msg)
		}
		return out
	}
	mp := build("multiprobe", ".")
	floor := build("floor", "./testdata/floor")
	progs := []struct {
		name string
		args []string
	}{
		{"multiprobe", []string{mp, "list", big, "uv_*"}},
		{"debugelf", []string{build("debugelf", "./testdata/debugelf"), big, "uv_*"}},
		{"floor", []string{floor, big}},
		{"mp-start", []string{mp, "help"}},
		{"floor-start", []string{floor, floor}},
	}
	took := make([]time.Duration, len(progs))
	i := 0
	for b.Loop() {
		// In turn, starting with another one each time, so that each
		// sees the same machine and page cache.
		for j := range progs {
			p := progs[(i+j)%len(progs)]
			t0 := time.Now()
			if out, err := exec.Command(p.args[0], p.args[1:]...).CombinedOutput(); err != nil {
				b.Fatalf("%s: %v\n%s", p.name, err, out)
			}
			took[(i+j)%len(progs)] += time.Since(t0)
		}
		i++
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(b.N) }
	for j, p := range progs {
		b.ReportMetric(ms(took[j]), p.name+"-ms")
	}
	b.ReportMetric(float64(took[0])/float64(took[2]), "mp/floor")
	b.ReportMetric(float64(took[1])/float64(took[0]), "debugelf/mp")
	b.ReportMetric(float64(took[0]-took[3])/float64(took[2]-took[4]), "mp-work/floor-work")
}
