package pidfilter

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/cilium/ebpf"
)

// Filter is the pid set of a loaded program with an injected filter. Changes
// take effect for the next event, while the program stays attached. It is
// safe for concurrent use.
type Filter struct {
	mu sync.Mutex
	m  *ebpf.Map
}

// New wraps the loaded pid set map m (the collection's map named MapName).
// The Filter does not own m: closing the collection closes it.
func New(m *ebpf.Map) (*Filter, error) {
	if m == nil {
		return nil, fmt.Errorf("pidfilter: nil map: %w", ErrBadMap)
	}
	if !fits(m.Type(), m.KeySize(), m.ValueSize()) {
		return nil, fmt.Errorf("pidfilter: map %v is %v with key/value size %d/%d: %w", m, m.Type(), m.KeySize(), m.ValueSize(), ErrBadMap)
	}
	return &Filter{m: m}, nil
}

// FromCollection returns the Filter of a collection loaded from a spec
// prepared by Inject.
func FromCollection(c *ebpf.Collection) (*Filter, error) {
	if c == nil || c.Maps[MapName] == nil {
		return nil, fmt.Errorf("pidfilter: collection has no map %s (prepare its spec with Inject): %w", MapName, ErrBadMap)
	}
	return New(c.Maps[MapName])
}

// Map returns the underlying BPF map.
func (f *Filter) Map() *ebpf.Map { return f.m }

// Add puts pids into the set. It fails, leaving the pids added so far, when
// a pid is not positive or the set is full (the map's MaxEntries).
func (f *Filter) Add(pids ...int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.add(pids)
}

func (f *Filter) add(pids []int) error {
	one := uint8(1)
	for _, pid := range pids {
		key, err := keyOf(pid)
		if err != nil {
			return err
		}
		if err := f.m.Update(key, one, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("pidfilter: adding pid %d to %v (capacity %d): %w", pid, f.m, f.m.MaxEntries(), err)
		}
	}
	return nil
}

// Remove takes pids out of the set; pids not in it are ignored.
func (f *Filter) Remove(pids ...int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.remove(pids)
}

func (f *Filter) remove(pids []int) error {
	for _, pid := range pids {
		key, err := keyOf(pid)
		if err != nil {
			return err
		}
		if err := f.m.Delete(key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("pidfilter: removing pid %d from %v: %w", pid, f.m, err)
		}
	}
	return nil
}

// Set makes the set exactly pids. Pids staying in the set are never
// missing in between: the new ones are added before the others go.
func (f *Filter) Set(pids ...int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, pid := range pids {
		if _, err := keyOf(pid); err != nil {
			return err
		}
	}
	old, err := f.pids()
	if err != nil {
		return err
	}
	if err := f.add(pids); err != nil {
		return err
	}
	var gone []int
	for _, p := range old {
		if !slices.Contains(pids, p) {
			gone = append(gone, p)
		}
	}
	return f.remove(gone)
}

// PIDs returns the set, sorted.
func (f *Filter) PIDs() ([]int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pids()
}

func (f *Filter) pids() ([]int, error) {
	var (
		key uint32
		val uint8
		out []int
	)
	it := f.m.Iterate()
	for it.Next(&key, &val) {
		out = append(out, int(key))
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("pidfilter: reading %v: %w", f.m, err)
	}
	slices.Sort(out)
	return out, nil
}

// ErrBadPID is returned for a pid that is not positive or does not fit the
// kernel's 32-bit pid.
var ErrBadPID = errors.New("bad pid")

func keyOf(pid int) (uint32, error) {
	if pid <= 0 || int64(pid) > int64(^uint32(0)>>1) {
		return 0, fmt.Errorf("pidfilter: pid %d: %w", pid, ErrBadPID)
	}
	return uint32(pid), nil
}
