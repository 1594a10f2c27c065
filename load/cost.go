package load

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
)

// costCacheVersion is bumped when the file layout or the key changes; a file
// of another version is ignored.
const costCacheVersion = 1

// maxCostEntries bounds the cache file: the oldest entries go first, so
// programs and kernels no longer in use age out.
const maxCostEntries = 4096

// Cost is what one load of a program measured.
type Cost struct {
	// Verify is the wall time of the successful BPF_PROG_LOAD.
	Verify time.Duration `json:"verify_ns"`
	// Verified is the number of instructions the verifier processed
	// (0 before Linux 5.16, which added the counter).
	Verified uint32 `json:"verified_insns"`
	// Instructions is the program's static instruction count.
	Instructions int `json:"insns"`
}

type costEntry struct {
	Name string `json:"name"`
	Cost
	Updated time.Time `json:"updated"`
}

type costFile struct {
	Version  int                  `json:"version"`
	Programs map[string]costEntry `json:"programs"`
}

// CostCache remembers the measured verification cost of programs per kernel
// release, so that the next start can order its loads by measured cost
// ([OrderCached]) instead of by instruction count.
//
// A program is keyed by a hash of its type, expected attach type, attach
// target and instructions (map references by name, not fd) together with the
// kernel release: changing the program or booting another kernel misses the
// cache and falls back to the instruction count.
//
// A CostCache is safe for concurrent use.
type CostCache struct {
	path    string
	release string

	mu      sync.Mutex
	entries map[string]costEntry
}

// DefaultCostCachePath returns where [OpenCostCache] keeps the costs when
// given no path: multiprobe/load-costs.json in the user's cache directory.
func DefaultCostCachePath() (string, error) {
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("cost cache: %w (set XDG_CACHE_HOME or HOME, or pass a path)", err)
	}
	return filepath.Join(dir, "multiprobe", "load-costs.json"), nil
}

// OpenCostCache reads the cost cache at path, or at [DefaultCostCachePath]
// if path is empty. A missing file gives an empty cache. A file that cannot
// be decoded (corrupt, or of another version) also gives an empty cache,
// which [CostCache.Save] overwrites: a cache must never stop an agent from
// starting. Other read errors are returned; a path another user could have
// planted or could change (see [ErrUnsafeCostCache]) is refused, and the
// file is opened without following a symlink or blocking, and read only up
// to a size no cache reaches.
func OpenCostCache(path string) (*CostCache, error) {
	if path == "" {
		p, err := DefaultCostCachePath()
		if err != nil {
			return nil, err
		}
		path = p
	}
	c := &CostCache{path: path, release: kernelRelease(), entries: map[string]costEntry{}}
	d, err := openCostDir(filepath.Dir(path))
	if errors.Is(err, fs.ErrNotExist) {
		// Save creates the directory.
		return c, nil
	}
	if err != nil {
		return nil, err
	}
	defer d.close()
	data, err := d.read(filepath.Base(path))
	if errors.Is(err, fs.ErrNotExist) {
		return c, nil
	}
	if err != nil {
		return nil, err
	}
	if entries, err := decodeCosts(data); err == nil {
		c.entries = entries
	}
	return c, nil
}

// NewCostCache returns an empty cache that [CostCache.Save] writes to path;
// with an empty path it lives in memory only and Save does nothing.
func NewCostCache(path string) *CostCache {
	return &CostCache{path: path, release: kernelRelease(), entries: map[string]costEntry{}}
}

func decodeCosts(data []byte) (map[string]costEntry, error) {
	var f costFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("decode cost cache: %w", err)
	}
	if f.Version != costCacheVersion {
		return nil, fmt.Errorf("cost cache version %d, want %d", f.Version, costCacheVersion)
	}
	entries := make(map[string]costEntry, len(f.Programs))
	for k, e := range f.Programs {
		if e.Verify < 0 || e.Instructions < 0 {
			continue
		}
		entries[k] = e
	}
	return entries, nil
}

// Path returns the file the cache is saved to ("" for memory only).
func (c *CostCache) Path() string { return c.path }

// Len returns the number of programs the cache knows, for any kernel.
func (c *CostCache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

// Lookup returns the cost recorded for spec on the running kernel.
func (c *CostCache) Lookup(spec *ebpf.ProgramSpec) (Cost, bool) {
	return c.lookup(spec, spec.AttachType)
}

func (c *CostCache) lookup(spec *ebpf.ProgramSpec, attach ebpf.AttachType) (Cost, bool) {
	key := c.key(spec, attach)
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	return e.Cost, ok
}

// Record stores the cost measured for spec on the running kernel, replacing
// an older measurement: the last start is the best predictor of the next.
func (c *CostCache) Record(spec *ebpf.ProgramSpec, cost Cost) {
	c.record(spec, spec.AttachType, cost)
}

func (c *CostCache) record(spec *ebpf.ProgramSpec, attach ebpf.AttachType, cost Cost) {
	key := c.key(spec, attach)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries[key] = costEntry{Name: spec.Name, Cost: cost, Updated: time.Now().UTC()}
}

// Save writes the cache to its file, creating the directory, through a
// temporary file renamed into place so that a concurrent reader never sees
// half a file. It refuses, wrapping [ErrUnsafeCostCache], a directory that
// is not the user's own or that others can write, and a path that exists as
// anything but a regular file (a device node is never replaced).
func (c *CostCache) Save() error {
	if c.path == "" {
		return nil
	}
	c.mu.Lock()
	if len(c.entries) > maxCostEntries {
		keys := make([]string, 0, len(c.entries))
		for k := range c.entries {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, func(a, b string) int { return c.entries[b].Updated.Compare(c.entries[a].Updated) })
		for _, k := range keys[maxCostEntries:] {
			delete(c.entries, k)
		}
	}
	data, err := json.MarshalIndent(costFile{Version: costCacheVersion, Programs: c.entries}, "", "\t")
	c.mu.Unlock()
	if err != nil {
		return fmt.Errorf("encode cost cache: %w", err)
	}
	dir := filepath.Dir(c.path)
	// A new directory is made private; an existing one is checked as it is.
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("save cost cache: %w", err)
	}
	d, err := openCostDir(dir)
	if err != nil {
		return err
	}
	defer d.close()
	return d.write(filepath.Base(c.path), append(data, '\n'))
}

// key hashes what decides the verifier's work: the program's type, expected
// attach type and target, and its instructions with map references by name
// (fds differ from run to run), plus the kernel release (another verifier).
func (c *CostCache) key(spec *ebpf.ProgramSpec, attach ebpf.AttachType) string {
	h := sha256.New()
	var buf [8]byte
	word := func(v uint64) {
		binary.LittleEndian.PutUint64(buf[:], v)
		h.Write(buf[:])
	}
	str := func(s string) {
		word(uint64(len(s)))
		h.Write([]byte(s))
	}
	str(c.release)
	word(uint64(spec.Type))
	word(uint64(attach))
	str(spec.AttachTo)
	word(uint64(len(spec.Instructions)))
	for _, ins := range spec.Instructions {
		word(uint64(ins.OpCode))
		word(uint64(ins.Dst)<<8 | uint64(ins.Src))
		word(uint64(uint16(ins.Offset)))
		if ins.IsLoadFromMap() && ins.Reference() != "" {
			// The constant holds the map's fd once associated.
			word(0)
		} else {
			word(uint64(ins.Constant))
		}
		str(ins.Reference())
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// kernelRelease returns the running kernel's release (uname -r).
func kernelRelease() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}
