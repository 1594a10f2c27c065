package maplock_test

import (
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/multiprobe/multiprobe/internal/maplock"
	"github.com/multiprobe/multiprobe/pidfilter"
	"github.com/multiprobe/multiprobe/probetest"
	"github.com/multiprobe/multiprobe/usdt"
)

// TestSharedByID: a map and its clone are one lock, released by its last
// holder; another map is another lock.
func TestSharedByID(t *testing.T) {
	probetest.RequireBPF(t)
	before := maplock.Locks()
	m := newMap(t)
	clone, err := m.Clone()
	if err != nil {
		t.Fatal(err)
	}
	defer clone.Close()
	a, b, c := hold(t, m), hold(t, clone), hold(t, newMap(t))
	if got := maplock.Locks() - before; got != 2 {
		t.Errorf("%d locks for two maps", got)
	}
	// One lock: b waits for a.
	a.Lock()
	locked := make(chan struct{})
	go func() { b.Lock(); close(locked); b.Unlock() }()
	select {
	case <-locked:
		t.Fatal("the clone's holder took the lock its map's holder has")
	case <-time.After(100 * time.Millisecond): // b waits, as it must
	}
	a.Unlock()
	<-locked
	a.Release()
	a.Release() // once only
	if got := maplock.Locks() - before; got != 2 {
		t.Errorf("%d locks with a holder left on each map", got)
	}
	b.Release()
	c.Release()
	if got := maplock.Locks() - before; got != 0 {
		t.Errorf("%d locks left after the last holders", got)
	}
}

// TestSoak makes 10,000 pid filters and USDT spec tables over fresh maps,
// each used and closed, some at once: the registry ends as it began.
func TestSoak(t *testing.T) {
	probetest.RequireBPF(t)
	before := maplock.Locks()
	const cycles, workers = 10_000, 4
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range cycles / workers {
				if err := cycle(w*cycles + i); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if got := maplock.Locks(); got != before {
		t.Errorf("%d map locks after %d cycles, %d before", got, cycles, before)
	}
}

func cycle(i int) error {
	f, err := pidfilter.NewFilter(4)
	if err != nil {
		return err
	}
	if err := f.Acquire(i + 1); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	m, err := ebpf.NewMap(usdt.SpecMapSpec(4))
	if err != nil {
		return err
	}
	defer m.Close()
	ids, err := usdt.AcquireSpecs(m, []usdt.Spec{{}})
	if err != nil {
		return err
	}
	return ids.Release()
}

func newMap(t *testing.T) *ebpf.Map {
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func hold(t *testing.T, m *ebpf.Map) *maplock.Hold {
	h, err := maplock.For(m)
	if err != nil {
		t.Fatal(err)
	}
	return h
}
