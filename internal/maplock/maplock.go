// Package maplock serializes the read-modify-write updates that several
// holders in one process make to one BPF map, such as the reference counts
// of a pid set or of a USDT spec table. Holders of one map meet by its
// kernel id, so two handles of it (a clone, a map opened by id) share one
// lock. A lock lives while it has holders: the last Release removes it, so
// that a process that makes and closes maps for months keeps no lock for a
// map it no longer holds.
package maplock

import (
	"fmt"
	"sync"

	"github.com/cilium/ebpf"
)

// A Hold is one holder's share of a map's lock: Lock and Unlock it around
// an update, and Release it once when done with the map.
type Hold struct {
	l    *lock
	once sync.Once
}

type lock struct {
	mu      sync.Mutex
	id      ebpf.MapID
	holders int // under registry.mu
}

var registry struct {
	sync.Mutex
	locks map[ebpf.MapID]*lock
}

// For returns a hold on the lock of m's kernel id.
func For(m *ebpf.Map) (*Hold, error) {
	info, err := m.Info()
	if err != nil {
		return nil, fmt.Errorf("map info of %v: %w", m, err)
	}
	// Kernels before 4.13 have no map ids; nothing else on them runs this
	// library either, so one lock for all is enough there.
	id, _ := info.ID()
	registry.Lock()
	defer registry.Unlock()
	l := registry.locks[id]
	if l == nil {
		if registry.locks == nil {
			registry.locks = map[ebpf.MapID]*lock{}
		}
		l = &lock{id: id}
		registry.locks[id] = l
	}
	l.holders++
	return &Hold{l: l}, nil
}

// Lock locks the map for this holder's update.
func (h *Hold) Lock() { h.l.mu.Lock() }

// Unlock unlocks it.
func (h *Hold) Unlock() { h.l.mu.Unlock() }

// Release gives the hold back; the map's last holder removes its lock.
// Later calls do nothing. Lock and Unlock still work after it, for a
// holder that releases before its last update, but no longer exclude a
// holder that arrives afterwards.
func (h *Hold) Release() {
	h.once.Do(func() {
		registry.Lock()
		defer registry.Unlock()
		if h.l.holders--; h.l.holders == 0 {
			delete(registry.locks, h.l.id)
		}
	})
}

// Locks returns how many maps have a lock: for tests that check that
// nothing is left.
func Locks() int {
	registry.Lock()
	defer registry.Unlock()
	return len(registry.locks)
}
