package pidfilter

import (
	"errors"
	"fmt"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/multiprobe/multiprobe/internal/maplock"
)

// AllPIDs stands for every process: while anyone holds it, the filter
// passes all events, whatever other pids are in the set. It is counted in
// the AllMapName map, not in the pid set.
const AllPIDs = 0

// Filter is the pid set of a loaded program with an injected filter: its
// MapName and AllMapName maps. Every pid in the set has a reference count
// as its value: several holders (for example several attachments of one
// program) may hold the same pid, and a pid leaves the set when its last
// holder releases it. [AllPIDs] is counted in the AllMapName map. Changes
// take effect for the next event, while the program stays attached.
//
// A Filter is safe for concurrent use, and so are Filters of one map
// opened separately in one process: they serialise on the map's kernel
// id. Processes that share a pinned map must not change it at once.
type Filter struct {
	m, all *ebpf.Map
	mu     *maplock.Hold // the lock every Filter of this map in the process shares
	owned  bool          // NewFilter made the maps: Close closes them
}

// ErrNotHeld is returned by Release for a pid that nobody holds.
var ErrNotHeld = errors.New("pid not held")

// New wraps the loaded maps of a filter: pids (named MapName) and all
// (named AllMapName). The Filter does not own them: closing the
// collection closes them. Close the Filter when done with it.
func New(pids, all *ebpf.Map) (*Filter, error) {
	for _, c := range []struct {
		m    *ebpf.Map
		want *ebpf.MapSpec
	}{{pids, MapSpec(0)}, {all, AllMapSpec()}} {
		if c.m == nil {
			return nil, fmt.Errorf("pidfilter: no %s map: %w", c.want.Name, ErrBadMap)
		}
		got := &ebpf.MapSpec{Type: c.m.Type(), KeySize: c.m.KeySize(), ValueSize: c.m.ValueSize(), MaxEntries: c.m.MaxEntries()}
		if !fitsSpec(got, c.want) {
			return nil, fmt.Errorf("pidfilter: map %v for %s is %v with key/value size %d/%d: %w", c.m, c.want.Name, got.Type, got.KeySize, got.ValueSize, ErrBadMap)
		}
	}
	mu, err := maplock.For(pids)
	if err != nil {
		return nil, fmt.Errorf("pidfilter: %w", err)
	}
	return &Filter{m: pids, all: all, mu: mu}, nil
}

// NewFilter makes a filter's two maps, with room for maxPIDs pids, and
// returns the Filter that owns them: point a program's filter at them with
// AssociateMap (see InjectProgram), and Close the Filter when done. The
// set starts empty.
func NewFilter(maxPIDs uint32) (*Filter, error) {
	pids, err := ebpf.NewMap(MapSpec(maxPIDs))
	if err != nil {
		return nil, fmt.Errorf("pidfilter: creating %s: %w", MapName, err)
	}
	all, err := ebpf.NewMap(AllMapSpec())
	if err != nil {
		pids.Close()
		return nil, fmt.Errorf("pidfilter: creating %s: %w", AllMapName, err)
	}
	f, err := New(pids, all)
	if err != nil {
		pids.Close()
		all.Close()
		return nil, err
	}
	f.owned = true
	return f, nil
}

// Close closes the maps if NewFilter made them; for a Filter from New or
// FromCollection, whose maps are the caller's, it only gives back the
// Filter's share of the map's lock. Close every Filter when done with it.
func (f *Filter) Close() error {
	f.mu.Release()
	if !f.owned {
		return nil
	}
	f.owned = false
	return errors.Join(f.m.Close(), f.all.Close())
}

// FromCollection returns the Filter of a collection loaded from a spec
// prepared by Inject.
func FromCollection(c *ebpf.Collection) (*Filter, error) {
	if c == nil || c.Maps[MapName] == nil || c.Maps[AllMapName] == nil {
		return nil, fmt.Errorf("pidfilter: collection has no maps %s and %s (prepare its spec with Inject): %w", MapName, AllMapName, ErrBadMap)
	}
	return New(c.Maps[MapName], c.Maps[AllMapName])
}

// Map returns the pid set map (MapName).
func (f *Filter) Map() *ebpf.Map { return f.m }

// AllMap returns the every-process map (AllMapName).
func (f *Filter) AllMap() *ebpf.Map { return f.all }

// Acquire takes one reference on each of pids (AllPIDs included), adding
// the ones not yet in the set. It is all or nothing: on error, for
// example a bad pid or a full map, the set is as before.
func (f *Filter) Acquire(pids ...int) error {
	for _, pid := range pids {
		if _, err := keyOf(pid); err != nil {
			return err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.acquire(pids)
}

func (f *Filter) acquire(pids []int) error {
	for i, pid := range pids {
		if err := f.adjust(pid, +1); err != nil {
			f.undo(pids[:i], -1)
			return err
		}
	}
	return nil
}

// Release drops one reference on each of pids, taking a pid out of the
// set with its last one. A pid that is not held is an error wrapping
// ErrNotHeld, but the other pids are still released.
func (f *Filter) Release(pids ...int) error {
	for _, pid := range pids {
		if _, err := keyOf(pid); err != nil {
			return err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var errs []error
	for _, pid := range pids {
		errs = append(errs, f.adjust(pid, -1))
	}
	return errors.Join(errs...)
}

// Replace releases old and acquires new as one change: pids in both are
// never missing from the set in between, because new is acquired first.
// On error nothing changed.
func (f *Filter) Replace(old, new []int) error {
	for _, pid := range slices.Concat(old, new) {
		if _, err := keyOf(pid); err != nil {
			return err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, pid := range old {
		if n, err := f.count(pid); err != nil {
			return err
		} else if n == 0 {
			return fmt.Errorf("pidfilter: releasing pid %d from %v: %w", pid, f.m, ErrNotHeld)
		}
	}
	if err := f.acquire(new); err != nil {
		return err
	}
	for i, pid := range old {
		if err := f.adjust(pid, -1); err != nil {
			f.undo(old[:i], +1)
			f.undo(new, -1)
			return err
		}
	}
	return nil
}

// undo reverts adjustments made before a failure. It can fail only if
// the map itself fails, which then has been reported already.
func (f *Filter) undo(pids []int, delta int) {
	for _, pid := range pids {
		_ = f.adjust(pid, delta)
	}
}

// adjust adds delta to pid's reference count, inserting or deleting the
// key at the edges.
func (f *Filter) adjust(pid int, delta int) error {
	key, err := keyOf(pid)
	if err != nil {
		return err
	}
	n, err := f.count(pid)
	if err != nil {
		return err
	}
	if pid == AllPIDs {
		next := int64(n) + int64(delta)
		if next < 0 {
			return fmt.Errorf("pidfilter: releasing every process from %v: %w", f.all, ErrNotHeld)
		}
		if err := f.all.Update(uint32(0), uint32(next), ebpf.UpdateAny); err != nil {
			return fmt.Errorf("pidfilter: setting %v: %w", f.all, err)
		}
		if next == 0 && n > 0 {
			return f.purge()
		}
		return nil
	}
	mark, err := f.mark(pid)
	if err != nil {
		return err
	}
	switch next := int64(n) + int64(delta); {
	case next < 0:
		return fmt.Errorf("pidfilter: releasing pid %d from %v: %w", pid, f.m, ErrNotHeld)
	case next == 0 && mark == 0:
		all, err := f.count(AllPIDs)
		if err != nil {
			return err
		}
		if all > 0 {
			// Every process is let through: the pid stays, held by
			// nobody, until that ends (see purge).
			if err := f.m.Update(key, uint32(0), ebpf.UpdateExist); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("pidfilter: releasing pid %d in %v: %w", pid, f.m, err)
			}
			return nil
		}
		if err := f.m.Delete(key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("pidfilter: removing pid %d from %v: %w", pid, f.m, err)
		}
	case next >= descendant:
		return fmt.Errorf("pidfilter: pid %d in %v: reference count overflows", pid, f.m)
	default:
		// A descendant (FollowForks) stays one: it leaves the set at
		// its exit once no holder holds it.
		if err := f.m.Update(key, uint32(next)|mark, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("pidfilter: adding pid %d to %v (capacity %d): %w", pid, f.m, f.m.MaxEntries(), err)
		}
	}
	return nil
}

// purge removes the pids that nobody holds, kept while every process was
// let through, once that has ended.
//
// They were kept because the filter reads two maps, the every-process
// count and then the pid set, and a change writes them one after the
// other. A change from a set to every process sets the count first, and
// the other way the pids come first, so that a process let through before
// and after is let through at every moment between. A run reads the
// count (0) and then looks the pid up, and between those two reads the
// set may change twice: to every process and back, after which the pid is
// held again. Had the first change removed the pid, the look-up could
// miss it in between and drop a call of a process let through all along
// (1 of 20,004 calls in the 6.12 guest, switching in a loop, when the
// filter read the count again after a miss instead). Kept, the pid is in
// the set from its acquire to the first moment it is let through by
// nothing, so a run that read the count as 0 while the pid was held finds
// it.
func (f *Filter) purge() error {
	var (
		key, val uint32
		stale    []uint32
	)
	it := f.m.Iterate()
	for it.Next(&key, &val) {
		if val == 0 {
			stale = append(stale, key)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("pidfilter: reading %v: %w", f.m, err)
	}
	for _, k := range stale {
		if err := f.m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("pidfilter: removing pid %d from %v: %w", k, f.m, err)
		}
	}
	return nil
}

// Count returns how many references pid has: 0 when it is not in the set.
func (f *Filter) Count(pid int) (int, error) {
	if _, err := keyOf(pid); err != nil {
		return 0, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	n, err := f.count(pid)
	return int(n), err
}

func (f *Filter) count(pid int) (uint32, error) {
	var n uint32
	if pid == AllPIDs {
		if err := f.all.Lookup(uint32(0), &n); err != nil {
			return 0, fmt.Errorf("pidfilter: reading %v: %w", f.all, err)
		}
		return n, nil
	}
	n, err := f.value(pid)
	return n &^ descendant, err
}

// mark is pid's descendant mark (see FollowForks), 0 if it has none.
func (f *Filter) mark(pid int) (uint32, error) {
	if pid == AllPIDs {
		return 0, nil
	}
	n, err := f.value(pid)
	return n & descendant, err
}

// value is pid's value in the set, 0 when it is not in it.
func (f *Filter) value(pid int) (uint32, error) {
	var n uint32
	err := f.m.Lookup(uint32(pid), &n)
	switch {
	case errors.Is(err, ebpf.ErrKeyNotExist):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("pidfilter: reading pid %d in %v: %w", pid, f.m, err)
	}
	return n, nil
}

// PIDs returns the pids in the set, sorted; AllPIDs (0) comes first when
// someone holds it.
func (f *Filter) PIDs() ([]int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var (
		key uint32
		val uint32
		out []int
	)
	it := f.m.Iterate()
	for it.Next(&key, &val) {
		if val != 0 { // 0: held by nobody, kept while every process is let through (see purge)
			out = append(out, int(key))
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("pidfilter: reading %v: %w", f.m, err)
	}
	if n, err := f.count(AllPIDs); err != nil {
		return nil, err
	} else if n > 0 {
		out = append(out, AllPIDs)
	}
	slices.Sort(out)
	return out, nil
}

// ErrBadPID is returned for a pid that is negative or does not fit the
// kernel's 32-bit pid.
var ErrBadPID = errors.New("bad pid")

func keyOf(pid int) (uint32, error) {
	if pid < 0 || int64(pid) > int64(^uint32(0)>>1) {
		return 0, fmt.Errorf("pidfilter: pid %d: %w", pid, ErrBadPID)
	}
	return uint32(pid), nil
}
