package attach

import (
	"fmt"
	"testing"
	"time"

	"github.com/cilium/ebpf/link"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/probetest"
)

// BenchmarkUprobeMulti attaches and detaches one program at n sites of one
// binary: with this package on file offsets, and with cilium/ebpf's
// Executable.UprobeMulti by symbol name (which includes reading the ELF
// symbol table, as a one-shot user pays) and by address. It reports the
// attach and detach halves and the fds a link holds.
func BenchmarkUprobeMulti(b *testing.B) {
	probetest.RequireBPF(b)
	if f, err := kernelprobe.Detect(); err != nil || !f.UprobeMulti {
		probetest.Unavailable(b, "no uprobe_multi: %v %v", f, err)
	}
	c, err := testprogs.LoadCounter(kernelprobe.PathUprobeMulti)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()

	for _, n := range []int{1000, 10_000, 100_000} {
		path := testprogs.BuildTarget(b, n)
		offsets, err := testprogs.TargetOffsets(path, n)
		if err != nil {
			b.Fatal(err)
		}
		syms := names(n)
		cookies := make([]uint64, n)
		for i := range cookies {
			cookies[i] = uint64(i)
		}

		variants := []struct {
			name   string
			attach func() (func() error, error)
		}{
			{"multiprobe", func() (func() error, error) {
				l, err := UprobeMulti(c.CountEntry, []Target{{Path: path, Offsets: offsets}}, nil)
				if err != nil {
					return nil, err
				}
				return l.Close, nil
			}},
			{"cilium-symbols", func() (func() error, error) {
				ex, err := link.OpenExecutable(path)
				if err != nil {
					return nil, err
				}
				l, err := ex.UprobeMulti(syms, c.CountEntry, &link.UprobeMultiOptions{Cookies: cookies})
				if err != nil {
					return nil, err
				}
				return l.Close, nil
			}},
			{"cilium-addresses", func() (func() error, error) {
				ex, err := link.OpenExecutable(path)
				if err != nil {
					return nil, err
				}
				l, err := ex.UprobeMulti(nil, c.CountEntry, &link.UprobeMultiOptions{Addresses: offsets, Cookies: cookies})
				if err != nil {
					return nil, err
				}
				return l.Close, nil
			}},
		}
		for _, v := range variants {
			b.Run(fmt.Sprintf("sites=%d/%s", n, v.name), func(b *testing.B) {
				var attach, detach time.Duration
				fds := 0
				for b.Loop() {
					before, _ := testutil.OpenFDs()
					t0 := time.Now()
					closeFn, err := v.attach()
					if err != nil {
						b.Fatal(err)
					}
					t1 := time.Now()
					during, _ := testutil.OpenFDs()
					fds = during - before
					if err := closeFn(); err != nil {
						b.Fatal(err)
					}
					attach += t1.Sub(t0)
					detach += time.Since(t1)
				}
				b.ReportMetric(float64(attach.Nanoseconds())/float64(b.N), "attach-ns/op")
				b.ReportMetric(float64(detach.Nanoseconds())/float64(b.N), "detach-ns/op")
				b.ReportMetric(float64(fds), "fds/link")
			})
		}
	}
}
