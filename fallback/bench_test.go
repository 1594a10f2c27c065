package fallback

import (
	"fmt"
	"testing"

	"github.com/cilium/ebpf/link"
	"github.com/multiprobe/multiprobe/attach"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/probetest"
)

// BenchmarkFallback attaches and detaches n per-site uprobes, with Uprobes
// and with cilium/ebpf's Executable.Uprobe one site after the other. The
// 1,000-site runs take minutes per iteration with cilium:
//
//	go test -run '^$' -bench 'Fallback/.*/sites=100$' -benchtime 3x -count 6 ./fallback
//	go test -run '^$' -bench 'Fallback/.*/sites=1000$' -benchtime 1x -count 1 ./fallback
func BenchmarkFallback(b *testing.B) {
	probetest.RequireBPF(b)
	c, err := testprogs.LoadCounter(kernelprobe.PathPerfEvent)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	for _, n := range []int{100, 1000} {
		path := testprogs.PrivateTarget(b, n)
		offs, err := testprogs.TargetOffsets(path, n)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("multiprobe/sites=%d", n), func(b *testing.B) {
			for b.Loop() {
				l, err := Uprobes(c.CountEntry, []attach.Target{{Path: path, Offsets: offs}}, nil)
				if err != nil {
					b.Fatal(err)
				}
				if err := l.Close(); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("cilium/sites=%d", n), func(b *testing.B) {
			for b.Loop() {
				ex, err := link.OpenExecutable(path)
				if err != nil {
					b.Fatal(err)
				}
				links := make([]link.Link, 0, n)
				for i, off := range offs {
					l, err := ex.Uprobe("", c.CountEntry, &link.UprobeOptions{Address: off, Cookie: uint64(i)})
					if err != nil {
						b.Fatal(err)
					}
					links = append(links, l)
				}
				for _, l := range links {
					if err := l.Close(); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// BenchmarkClose compares the ways of detaching n per-site uprobes (attach
// time excluded) that closeLinks chooses between:
//
//	go test -run '^$' -bench 'Close' -benchtime 3x -count 6 ./fallback
func BenchmarkClose(b *testing.B) {
	probetest.RequireBPF(b)
	c, err := testprogs.LoadCounter(kernelprobe.PathPerfEvent)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	const n = 100
	path := testprogs.PrivateTarget(b, n)
	offs, err := testprogs.TargetOffsets(path, n)
	if err != nil {
		b.Fatal(err)
	}
	for _, s := range []struct {
		name  string
		close func([]link.Link) error
	}{
		{"sequential", closeSequential},
		{"each/workers=64", func(l []link.Link) error { return closeEach(l, 64) }},
		{"twophase", func(l []link.Link) error { return closeLinks(l, startProgress(nil, PhaseDetach, len(l))) }},
	} {
		b.Run(fmt.Sprintf("%s/sites=%d", s.name, n), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				l, err := Uprobes(c.CountEntry, []attach.Target{{Path: path, Offsets: offs}}, nil)
				if err != nil {
					b.Fatal(err)
				}
				links := l.links
				l.links = nil
				l.closed = true
				b.StartTimer()
				if err := s.close(links); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
