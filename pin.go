package multiprobe

import (
	"bytes"
	"compress/gzip"
	"debug/elf"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/multiprobe/multiprobe/attach"
	"github.com/multiprobe/multiprobe/elfsym"
	"github.com/multiprobe/multiprobe/fallback"
	"github.com/multiprobe/multiprobe/internal/target"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/pidfilter"
	"github.com/multiprobe/multiprobe/usdt"
	"golang.org/x/sys/unix"
)

// What Pin leaves in its directory. A BPF filesystem holds only BPF
// objects, so the manifest is a map too: a frozen array of manifestChunk
// byte values holding the gzip'ed JSON.
const (
	pinManifest   = "manifest"
	pinProgram    = "prog"        // prog0, prog1, ...: the attached programs
	pinPIDs       = "pids"        // the link's own pid filter
	pinAllPIDs    = "pids_all"    //
	pinUSDTSpecs  = "usdt_specs"  // the spec map the USDT sites' ids are in
	pinGenState   = "gen_state"   // the generation check's maps (Link.Update)
	pinGenSlots   = "gen_slots"   //
	pinGenRetired = "gen_retired" //
	// The kernel links of each unit (an attach call: one kind of probe,
	// one generation) in directories unit0, unit1, ...: attach.Link.Pin or
	// fallback.Link.Pin lay them out.
	pinUnit = "unit"

	manifestChunk = 4096
	// bpfFSMagic is BPF_FS_MAGIC and rdonlyProg BPF_F_RDONLY_PROG
	// (include/uapi/linux/magic.h, bpf.h), as numbers so that the package
	// builds where x/sys/unix has no Linux names.
	bpfFSMagic = 0xcafe4a11
	rdonlyProg = 1 << 7
	// maxManifest bounds the manifest's JSON, about 300 bytes per site;
	// each part is bounded tighter by what it can need (see gunzipPart).
	maxManifest = 1 << 30
	// A part's JSON is at most manifestSlack more than headRatio times
	// its gzip'ed size (the head: numbers, which gzip about 5 to 1), and
	// the sites' at most siteJSON a site, for as many sites as the units
	// have offsets, and the refused ones beside them.
	manifestSlack = 1 << 20
	headRatio     = 64
	siteJSON      = 16 << 10
	// pinVersion is the manifest's format. LoadPinnedLink refuses others.
	pinVersion = 1
)

var (
	// ErrNotPinned: there is no pinned Link in the directory given to
	// LoadPinnedLink, or Unpin was called on a Link that is not pinned.
	ErrNotPinned = errors.New("no pinned multiprobe link")
	// ErrPinVersion: the directory holds a Link pinned by a version of
	// multiprobe whose manifest this one does not read.
	ErrPinVersion = errors.New("pinned by another version of multiprobe")
)

// manifest is what LoadPinnedLink needs besides the kernel's objects to
// give back the Link: its sites and how they were attached, and the
// identity of each binary, to tell whether it changed since.
type manifest struct {
	Version   int                  `json:"version"`
	Features  kernelprobe.Features `json:"features"`
	KernelPID int                  `json:"kernel_pid,omitempty"`
	// Programs are the attached programs, copies of the user's if
	// Clones. Gen is the current generation, Updatable whether the Link
	// has the generation check (pinned as pinGenState, pinGenSlots).
	Programs []pinnedProg `json:"programs"`
	// ProgramTag is the tag of the program given to Attach or
	// UpdateProgram, of which Programs are copies if Clones (Link.Runs).
	ProgramTag string       `json:"program_tag,omitempty"`
	Clones     bool         `json:"clones,omitempty"`
	Gen        uint32       `json:"gen,omitempty"`
	Updatable  bool         `json:"updatable,omitempty"`
	Filter     bool         `json:"filter,omitempty"`
	USDTIDs    []uint32     `json:"usdt_ids,omitempty"`
	Files      []fileID     `json:"files"`
	Units      []pinnedUnit `json:"units"`
	// Probes and Sites are a JSON document of their own (siteColumns),
	// the bulk of the manifest, which LoadPinnedLink decodes while it
	// takes the kernel's objects back.
	Probes []Probe      `json:"-"`
	Paths  []string     `json:"-"`
	Sites  []pinnedSite `json:"-"`

	sites []Site // Sites, as a Link reports them
}

// fileID is what identifies a binary: a pinned link holds the inode it was
// made on, whatever the path names later.
type fileID struct {
	Path    string `json:"path"`
	Dev     uint64 `json:"dev"`
	Ino     uint64 `json:"ino"`
	Size    int64  `json:"size"`
	MtimeNs int64  `json:"mtime_ns"`
	BuildID string `json:"build_id,omitempty"`
}

// pinnedProg is a program pinned as Pin, a copy of generation Gen.
type pinnedProg struct {
	Pin string `json:"pin"`
	Gen uint32 `json:"gen,omitempty"`
}

// pinnedUnit is one attach.Link or fallback.Link, pinned in Dir.
type pinnedUnit struct {
	Dir     string         `json:"dir"`
	Kind    Kind           `json:"kind"`
	Gen     uint32         `json:"gen,omitempty"`
	Targets []pinnedTarget `json:"targets"`
}

type pinnedTarget struct {
	File          int      `json:"file"` // index in manifest.Files
	Offsets       []uint64 `json:"offsets"`
	RefCtrOffsets []uint64 `json:"ref_ctr_offsets,omitempty"`
	Cookies       []uint64 `json:"cookies"`
}

type pinnedSite struct {
	Name    string        `json:"n"`
	Names   []string      `json:"ns,omitempty"`
	Offset  uint64        `json:"o"`
	Probe   int           `json:"p,omitempty"` // index in siteTable.Probes
	Path    int           `json:"f,omitempty"` // index in siteTable.Paths
	Cookie  uint64        `json:"c,omitempty"`
	Moved   uint8         `json:"m,omitempty"`
	Note    string        `json:"no,omitempty"`
	Returns []uint64      `json:"r,omitempty"`
	RefCtr  uint64        `json:"rc,omitempty"`
	Symbol  *pinnedSymbol `json:"s,omitempty"`
	USDT    *usdt.Site    `json:"u,omitempty"`
}

// pinnedSymbol is an elfsym.Site without what its site repeats (name,
// offset, move and note, given only where they differ): the sites are
// most of a manifest, which a restarting agent decodes.
type pinnedSymbol struct {
	Name         string   `json:"n,omitempty"`
	Aliases      []string `json:"a,omitempty"`
	Version      string   `json:"v,omitempty"`
	Bind         uint8    `json:"b,omitempty"`
	Type         uint8    `json:"t,omitempty"`
	Size         uint64   `json:"s,omitempty"`
	Address      uint64   `json:"ad,omitempty"`
	Offset       uint64   `json:"o,omitempty"`
	SymbolOffset uint64   `json:"so,omitempty"`
	Moved        uint8    `json:"m,omitempty"`
	Note         string   `json:"no,omitempty"`
}

func pinSymbol(s Site) *pinnedSymbol {
	y := s.Symbol
	if y == nil {
		return nil
	}
	p := &pinnedSymbol{Aliases: y.Aliases, Version: y.Version, Bind: uint8(y.Bind), Type: uint8(y.Type),
		Size: y.Size, Address: y.Address, SymbolOffset: y.SymbolOffset, Moved: uint8(y.Moved)}
	if y.Name != s.Name {
		p.Name = y.Name
	}
	if y.Offset != s.Offset {
		p.Offset = y.Offset
	}
	if y.Note != s.Note {
		p.Note = y.Note
	}
	return p
}

func (p *pinnedSymbol) site(s *Site) *elfsym.Site {
	if p == nil {
		return nil
	}
	y := &elfsym.Site{Name: p.Name, Aliases: p.Aliases, Version: p.Version, Bind: elf.SymBind(p.Bind), Type: elf.SymType(p.Type),
		Size: p.Size, Address: p.Address, Offset: p.Offset, SymbolOffset: p.SymbolOffset, Moved: elfsym.Move(p.Moved), Note: p.Note}
	if y.Name == "" {
		y.Name = s.Name
	}
	if y.Offset == 0 {
		y.Offset = s.Offset
	}
	if y.Note == "" {
		y.Note = s.Note
	}
	return y
}

// Pin pins everything the link holds in dir, a directory on a BPF
// filesystem (created if missing): the kernel links, the programs they
// run, the link's pid filter, the USDT spec map its sites' ids are in,
// and a manifest of its sites and binaries. The probes then stay attached
// after Close and after this process exits, for LoadPinnedLink to take
// back, until Unpin. Pin is all or nothing; what a Pin cut short by a
// crash left in dir (pins without a manifest: links no one owns) is
// silenced and removed first.
//
// Pinning needs links the kernel can pin: perf-event uprobes are not links
// before Linux 5.15, and Pin fails there with an error wrapping
// fallback.ErrPinUnsupported.
//
// The user's own maps (counters, histograms) are the user's to pin, with
// ebpf.Map.Pin or cilium/ebpf's MapOptions.PinPath.
func (l *Link) Pin(dir string) (err error) {
	l.state.Lock()
	defer l.state.Unlock()
	if len(l.units) == 0 {
		return fmt.Errorf("multiprobe: pin of a closed link: %w", os.ErrClosed)
	}
	if l.pinDir != "" {
		return fmt.Errorf("multiprobe: the link is pinned at %s already: Unpin it first", l.pinDir)
	}
	if err := checkPinDir(dir); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(dir, pinManifest)); err == nil {
		return fmt.Errorf("multiprobe: %s holds a pinned link already: %w", dir, os.ErrExist)
	}
	if _, err := clearHalfPin(dir); err != nil {
		return fmt.Errorf("multiprobe: removing the pins of a Pin cut short in %s: %w", dir, err)
	}
	l.pinDir = dir
	defer func() {
		if err != nil {
			err = errors.Join(fmt.Errorf("multiprobe: pinning in %s: %w", dir, err), l.unpin())
		}
	}()
	pins := l.programPins()
	for i, p := range l.programs() {
		if err := pinClone(p, filepath.Join(dir, pins[i].Pin)); err != nil {
			return err
		}
	}
	if l.filter != nil {
		if err := pinClone(l.filter.Map(), filepath.Join(dir, pinPIDs)); err != nil {
			return err
		}
		if err := pinClone(l.filter.AllMap(), filepath.Join(dir, pinAllPIDs)); err != nil {
			return err
		}
	}
	if l.specIDs != nil {
		if err := l.specIDs.Pin(filepath.Join(dir, pinUSDTSpecs)); err != nil {
			return err
		}
	}
	if l.genState != nil {
		if err := pinClone(l.genState, filepath.Join(dir, pinGenState)); err != nil {
			return err
		}
		if err := pinClone(l.genSlots, filepath.Join(dir, pinGenSlots)); err != nil {
			return err
		}
		if err := pinClone(l.genRetired, filepath.Join(dir, pinGenRetired)); err != nil {
			return err
		}
	}
	for _, u := range l.units {
		if err := l.pinUnit(u); err != nil {
			return err
		}
		if err := fault("pin: unit pinned"); err != nil {
			return err
		}
	}
	// Last, so that a manifest means a complete pin.
	return writeManifest(l.buildManifest(), filepath.Join(dir, pinManifest))
}

// pinUnit pins u in a directory of its own under the link's: a unit
// pinned before (kept by an update) through second handles, so that its
// pins stay where the manifest in place says until it is replaced.
func (l *Link) pinUnit(u *unit) error {
	again := u.pinDir != ""
	var sub string
	for {
		u.pinDir = pinUnit + strconv.Itoa(l.pinSeq)
		l.pinSeq++
		sub = filepath.Join(l.pinDir, u.pinDir)
		err := os.Mkdir(sub, 0o700)
		if err == nil {
			break
		}
		if !errors.Is(err, os.ErrExist) {
			return err
		}
		// Left by an update that could not remove it: the next name.
	}
	if again {
		return u.pinAgain(sub)
	}
	return u.pin(sub)
}

// programPins names the pins of Programs: "prog" for the program itself,
// "progG_K" for the Kth copy of generation G, a name that stays as long
// as the copy does.
func (l *Link) programPins() []pinnedProg {
	if len(l.clones) == 0 {
		return []pinnedProg{{Pin: pinProgram}}
	}
	out := make([]pinnedProg, len(l.clones))
	k := map[uint32]int{}
	for i, g := range l.cloneGens {
		out[i] = pinnedProg{Pin: fmt.Sprintf("%s%d_%d", pinProgram, g, k[g]), Gen: g}
		k[g]++
	}
	return out
}

// pinClone pins a duplicate of obj: pinning obj itself would move a pin
// its owner made elsewhere.
func pinClone[T interface {
	Clone() (T, error)
	Pin(string) error
	Close() error
}](obj T, path string) error {
	c, err := obj.Clone()
	if err != nil {
		return err
	}
	defer c.Close()
	return c.Pin(path)
}

// Unpin removes what Pin pinned, so that Close detaches the probes and
// frees what they hold, and removes the directory if that leaves it
// empty. The Link stays attached until Close.
func (l *Link) Unpin() error {
	l.state.Lock()
	defer l.state.Unlock()
	return l.unpin()
}

func (l *Link) unpin() error {
	dir := l.pinDir
	if dir == "" {
		return fmt.Errorf("multiprobe: Unpin: %w", ErrNotPinned)
	}
	var errs []error
	for _, u := range l.units {
		errs = append(errs, u.unpin())
		u.pinDir = "" // a Pin again pins it anew, not through second handles
	}
	// Whatever of the link's layout is there, also what an update cut
	// short left.
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	for _, e := range ents {
		if ownPin(e.Name()) {
			errs = append(errs, os.RemoveAll(filepath.Join(dir, e.Name())))
		}
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.ENOTEMPTY) {
		errs = append(errs, err)
	}
	l.pinDir = ""
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("multiprobe: unpinning %s: %w", dir, err)
	}
	return nil
}

// buildManifest describes l for LoadPinnedLink.
func (l *Link) buildManifest() *manifest {
	m := &manifest{
		Version:    pinVersion,
		Features:   l.features,
		KernelPID:  l.kernelPID,
		Programs:   l.programPins(),
		ProgramTag: l.progTag,
		Clones:     len(l.clones) > 0,
		Filter:     l.filter != nil,
		Gen:        l.gen,
		Updatable:  l.genState != nil,
	}
	if l.specIDs != nil {
		m.USDTIDs = l.specIDs.IDs()
	}
	files := map[fileID]int{}
	for _, u := range l.units {
		pu := pinnedUnit{Dir: u.pinDir, Kind: u.kind, Gen: u.gen}
		for i, t := range u.targets() {
			fi, ok := files[u.files[i]]
			if !ok {
				fi = len(m.Files)
				files[u.files[i]] = fi
				m.Files = append(m.Files, u.files[i])
			}
			pu.Targets = append(pu.Targets, pinnedTarget{File: fi, Offsets: t.Offsets, RefCtrOffsets: t.RefCtrOffsets, Cookies: t.Cookies})
		}
		m.Units = append(m.Units, pu)
	}
	probes, paths := map[*Probe]int{}, map[string]int{}
	for _, s := range l.sites() {
		pi, ok := probes[s.Probe]
		if !ok {
			pi = len(m.Probes)
			probes[s.Probe] = pi
			m.Probes = append(m.Probes, *s.Probe)
		}
		fi, ok := paths[s.Path]
		if !ok {
			fi = len(m.Paths)
			paths[s.Path] = fi
			m.Paths = append(m.Paths, s.Path)
		}
		m.Sites = append(m.Sites, pinnedSite{
			Name: s.Name, Names: s.Names, Offset: s.Offset, Probe: pi, Path: fi, Cookie: s.Cookie,
			Moved: uint8(s.Moved), Note: s.Note, Returns: s.Returns, RefCtr: s.RefCtrOffset, Symbol: pinSymbol(s), USDT: s.USDT,
		})
	}
	return m
}

// fileIDs are the identities of targets' binaries, which Resolve opened.
func (pl *Plan) fileIDs(targets []target.Target) []fileID {
	out := make([]fileID, len(targets))
	for i, t := range targets {
		out[i] = fileID{Path: t.Path}
		for _, of := range pl.files {
			if of.f == t.File {
				out[i] = fileID{
					Path: of.path, Dev: uint64(of.st.Dev), Ino: of.st.Ino, Size: of.st.Size,
					MtimeNs: unix.TimespecToNsec(of.st.Mtim), BuildID: hex.EncodeToString(of.buildID),
				}
				break
			}
		}
	}
	return out
}

// writeManifest stores m, gzip'ed JSON, in a frozen array map pinned at
// path.
func writeManifest(m *manifest, path string) error {
	data, err := encodeManifest(m)
	if err != nil {
		return err
	}
	n := (len(data) + manifestChunk - 1) / manifestChunk
	data = append(data, make([]byte, n*manifestChunk-len(data))...)
	mm, err := ebpf.NewMap(&ebpf.MapSpec{
		Name: "mp_manifest", Type: ebpf.Array, KeySize: 4, ValueSize: manifestChunk, MaxEntries: uint32(n),
		Flags: rdonlyProg,
	})
	if err != nil {
		return fmt.Errorf("creating the manifest map: %w", err)
	}
	defer mm.Close()
	for i := range n {
		if err := mm.Put(uint32(i), data[i*manifestChunk:(i+1)*manifestChunk]); err != nil {
			return fmt.Errorf("writing the manifest: %w", err)
		}
	}
	// Frozen, nobody changes it; a kernel too old to freeze maps
	// (before 5.2) has no uprobe links to pin either.
	if err := mm.Freeze(); err != nil {
		return fmt.Errorf("freezing the manifest: %w", err)
	}
	return mm.Pin(path)
}

// encodeManifest is m as gzip'ed JSON after its length.
func encodeManifest(m *manifest) ([]byte, error) {
	var out []byte
	for _, doc := range []any{m, toColumns(m.Probes, m.Paths, m.Sites)} {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		if err := json.NewEncoder(zw).Encode(doc); err != nil {
			return nil, err
		}
		if err := zw.Close(); err != nil {
			return nil, err
		}
		out = binary.NativeEndian.AppendUint64(out, uint64(buf.Len()))
		out = append(out, buf.Bytes()...)
	}
	return out, nil
}

// gunzipPart reads one length-prefixed gzip part off data and returns it
// decompressed, and the rest of data. limit bounds the part from what it
// can need (as a function of its gzip'ed size), so that a manifest anyone
// with access to the BPF filesystem wrote cannot make LoadPinnedLink
// inflate a gigabyte.
func gunzipPart(data []byte, limit func(zsize int) int) (part, rest []byte, err error) {
	if len(data) < 8 {
		return nil, nil, fmt.Errorf("not a multiprobe manifest (%d bytes): %w", len(data), ErrNotPinned)
	}
	size := binary.NativeEndian.Uint64(data)
	if size > uint64(len(data)-8) {
		return nil, nil, fmt.Errorf("not a multiprobe manifest (length %d): %w", size, ErrNotPinned)
	}
	zr, err := gzip.NewReader(bytes.NewReader(data[8 : 8+size]))
	if err != nil {
		return nil, nil, err
	}
	max := min(limit(int(size)), maxManifest)
	part, err = io.ReadAll(io.LimitReader(zr, int64(max)+1))
	if err != nil {
		return nil, nil, err
	}
	if len(part) > max {
		return nil, nil, fmt.Errorf("manifest part of %d bytes gzip'ed inflates past %d bytes, more than its sites can need: %w", size, max, ErrNotPinned)
	}
	return part, data[8+size:], nil
}

// readManifest reads what writeManifest wrote, but for the sites, which
// the function it returns decodes.
func readManifest(path string) (*manifest, func() error, error) {
	mm, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, fmt.Errorf("%s: %w", filepath.Dir(path), ErrNotPinned)
	}
	if err != nil {
		return nil, nil, err
	}
	defer mm.Close()
	if mm.Type() != ebpf.Array || mm.KeySize() != 4 || mm.ValueSize() != manifestChunk || mm.MaxEntries() == 0 {
		return nil, nil, fmt.Errorf("%s is not a multiprobe manifest: %w", path, ErrNotPinned)
	}
	data := make([]byte, 0, int(mm.MaxEntries())*manifestChunk)
	chunk := make([]byte, manifestChunk)
	for i := range mm.MaxEntries() {
		if err := mm.Lookup(i, chunk); err != nil {
			return nil, nil, fmt.Errorf("reading %s: %w", path, err)
		}
		data = append(data, chunk...)
	}
	m, sites, err := decodeManifestHead(data)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, func() error {
		if err := sites(); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		return nil
	}, nil
}

// decodeManifest decodes the bytes of the manifest map, which anyone with
// access to the BPF filesystem could have written.
func decodeManifest(data []byte) (*manifest, error) {
	m, sites, err := decodeManifestHead(data)
	if err != nil {
		return nil, err
	}
	return m, sites()
}

// decodeManifestHead decodes the manifest but its sites, which sites
// decodes (and checks).
func decodeManifestHead(data []byte) (_ *manifest, sites func() error, err error) {
	raw, rest, err := gunzipPart(data, func(zsize int) int { return manifestSlack + min(zsize, maxManifest/headRatio)*headRatio })
	if err != nil {
		return nil, nil, err
	}
	// One decode: the version is checked after it, and a manifest of
	// another version that does not even decode is told by its version.
	m := &manifest{}
	if err := json.Unmarshal(raw, m); err != nil {
		var head struct {
			Version int `json:"version"`
		}
		if json.Unmarshal(raw, &head) == nil && head.Version != pinVersion {
			return nil, nil, fmt.Errorf("manifest version %d, this multiprobe reads %d: %w", head.Version, pinVersion, ErrPinVersion)
		}
		return nil, nil, err
	}
	if m.Version != pinVersion {
		return nil, nil, fmt.Errorf("manifest version %d, this multiprobe reads %d: %w", m.Version, pinVersion, ErrPinVersion)
	}
	if err := m.check(); err != nil {
		return nil, nil, err
	}
	offsets := 0
	for _, u := range m.Units {
		for _, t := range u.Targets {
			offsets += len(t.Offsets)
		}
	}
	sites = func() error {
		raw, _, err := gunzipPart(rest, func(int) int { return manifestSlack + min(offsets+target.MaxRefusals, maxManifest/siteJSON)*siteJSON })
		if err != nil {
			return err
		}
		var c siteColumns
		if err := json.Unmarshal(raw, &c); err != nil {
			return err
		}
		if m.Sites, err = c.sites(); err != nil {
			return err
		}
		m.Probes, m.Paths = c.Probes, c.Paths
		return m.checkSites()
	}
	return m, sites, nil
}

// check refuses a manifest whose indexes point nowhere.
func (m *manifest) check() error {
	for _, p := range m.Programs {
		if !strings.HasPrefix(p.Pin, pinProgram) || strings.ContainsAny(p.Pin, "/.") {
			return fmt.Errorf("manifest: a program pinned as %q: %w", p.Pin, ErrNotPinned)
		}
	}
	for _, u := range m.Units {
		if u.Kind != Entry && u.Kind != Return {
			return fmt.Errorf("manifest: a unit of kind %v: %w", u.Kind, ErrNotPinned)
		}
		if !strings.HasPrefix(u.Dir, pinUnit) || strings.ContainsAny(u.Dir, "/.") {
			return fmt.Errorf("manifest: a unit in %q: %w", u.Dir, ErrNotPinned)
		}
		for _, t := range u.Targets {
			if t.File < 0 || t.File >= len(m.Files) || len(t.Cookies) != len(t.Offsets) ||
				(t.RefCtrOffsets != nil && len(t.RefCtrOffsets) != len(t.Offsets)) {
				return fmt.Errorf("manifest: a target of %d offsets is malformed: %w", len(t.Offsets), ErrNotPinned)
			}
		}
	}
	return nil
}

// checkSites refuses sites whose probe is not there, and builds them.
func (m *manifest) checkSites() error {
	m.sites = make([]Site, len(m.Sites))
	for i, s := range m.Sites {
		if s.Probe < 0 || s.Probe >= len(m.Probes) || s.Path < 0 || s.Path >= len(m.Paths) {
			return fmt.Errorf("manifest: site %s has probe %d of %d, path %d of %d: %w", s.Name, s.Probe, len(m.Probes), s.Path, len(m.Paths), ErrNotPinned)
		}
		site := &m.sites[i]
		*site = Site{
			Name: s.Name, Names: s.Names, Offset: s.Offset, Probe: &m.Probes[s.Probe], Path: m.Paths[s.Path], Cookie: s.Cookie,
			Moved: elfsym.Move(s.Moved), Note: s.Note, Returns: s.Returns, RefCtrOffset: s.RefCtr, USDT: s.USDT,
		}
		site.Symbol = s.Symbol.site(site)
	}
	return nil
}

// targets are unit u's targets as attach and fallback take them back.
func (m *manifest) targets(u pinnedUnit) []target.Target {
	ts := make([]target.Target, len(u.Targets))
	for i, t := range u.Targets {
		ts[i] = target.Target{Path: m.Files[t.File].Path, Offsets: t.Offsets, RefCtrOffsets: t.RefCtrOffsets, Cookies: t.Cookies}
	}
	return ts
}

// LoadPinnedLink takes back a Link that Link.Pin pinned in dir, in this
// process or another (an agent that restarted): it has the same Sites,
// PIDs and Programs, and SetPIDs works on it, while the probes never went
// off. It is pinned: Close releases this process's descriptors and leaves
// the probes attached; Unpin, then Close, detaches them.
//
// A pinned link holds the file it was made on: after an upgrade that
// replaced a binary (a new inode at its path), its sites probe the old
// file, which only processes started before still run. LoadPinnedLink
// compares every binary with what the manifest recorded, and StaleFiles
// reports the ones that changed.
//
// A directory that a process killed in Pin or Update left half-made is
// finished: the pins of a Pin cut short are removed (and ErrNotPinned
// returned), and beside a manifest, the pins of an Update cut short that
// it does not name; the Link is the set the manifest names, counting
// every call once. One process owns a directory at a time.
//
// Errors wrap ErrNotPinned (nothing pinned in dir), ErrPinVersion, or
// attach.ErrPinMismatch (the kernel's links do not hold the manifest's
// sites).
func LoadPinnedLink(dir string) (_ *Link, err error) {
	m, sites, err := readManifest(filepath.Join(dir, pinManifest))
	if _, serr := os.Stat(filepath.Join(dir, pinManifest)); errors.Is(serr, os.ErrNotExist) {
		// Nothing to take back; what a Pin cut short left counts for
		// no one.
		if cleared, cerr := clearHalfPin(dir); cleared || cerr != nil {
			err = errors.Join(fmt.Errorf("%w (removed the pins of a Pin cut short)", err), cerr)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("multiprobe: %w", err)
	}
	// The sites decode while the kernel's objects are taken back.
	sitesErr := make(chan error, 1)
	go func() { sitesErr <- sites() }()
	l := &Link{path: m.Features.Path(), features: m.Features, kernelPID: m.KernelPID, pinDir: dir, manifest: m, progTag: m.ProgramTag}
	defer func() {
		if err != nil {
			err = errors.Join(fmt.Errorf("multiprobe: taking back the link pinned in %s: %w", dir, err), l.Close())
		}
	}()
	for _, pp := range m.Programs {
		p, err := ebpf.LoadPinnedProgram(filepath.Join(dir, pp.Pin), nil)
		if err != nil {
			return nil, fmt.Errorf("program %s: %w", pp.Pin, err)
		}
		if m.Clones {
			l.clones = append(l.clones, p)
			l.cloneGens = append(l.cloneGens, pp.Gen)
			l.cloneFDs++
		} else {
			l.prog, l.ownProg = p, true
		}
	}
	if m.Filter {
		pids, err := ebpf.LoadPinnedMap(filepath.Join(dir, pinPIDs), nil)
		if err != nil {
			return nil, err
		}
		l.ownMaps = append(l.ownMaps, pids)
		all, err := ebpf.LoadPinnedMap(filepath.Join(dir, pinAllPIDs), nil)
		if err != nil {
			return nil, err
		}
		l.ownMaps = append(l.ownMaps, all)
		if l.filter, err = pidfilter.New(pids, all); err != nil {
			return nil, err
		}
		if l.pids, err = l.filter.PIDs(); err != nil {
			return nil, err
		}
	}
	if m.USDTIDs != nil {
		sm, err := ebpf.LoadPinnedMap(filepath.Join(dir, pinUSDTSpecs), nil)
		if err != nil {
			return nil, err
		}
		l.specIDs, err = usdt.HeldSpecs(sm, m.USDTIDs)
		sm.Close()
		if err != nil {
			return nil, err
		}
	}
	if m.Updatable {
		if l.genState, err = ebpf.LoadPinnedMap(filepath.Join(dir, pinGenState), nil); err != nil {
			return nil, err
		}
		if l.genSlots, err = ebpf.LoadPinnedMap(filepath.Join(dir, pinGenSlots), nil); err != nil {
			return nil, err
		}
		if l.genRetired, err = loadGenRetired(dir); err != nil {
			return nil, err
		}
		l.gen = m.Gen
	}
	for _, pu := range m.Units {
		sub := filepath.Join(dir, pu.Dir)
		u := &unit{kind: pu.Kind, gen: pu.Gen, pinDir: pu.Dir}
		if seq, err := strconv.Atoi(strings.TrimPrefix(pu.Dir, pinUnit)); err == nil {
			l.pinSeq = max(l.pinSeq, seq+1)
		}
		for _, t := range pu.Targets {
			u.files = append(u.files, m.Files[t.File])
		}
		if l.path == kernelprobe.PathUprobeMulti {
			u.multi, err = attach.LoadPinned(sub, m.targets(pu))
		} else {
			u.perSite, err = fallback.LoadPinned(sub, m.targets(pu))
		}
		if err != nil {
			return nil, err
		}
		l.units = append(l.units, u)
	}
	if err := <-sitesErr; err != nil {
		return nil, err
	}
	if err := l.recoverPins(); err != nil {
		return nil, fmt.Errorf("finishing an update cut short: %w", err)
	}
	l.stale = l.checkFiles()
	return l, nil
}

// checkFiles compares each binary with the manifest: by the kernel's name
// of the file a uprobe_multi link holds, which ends in " (deleted)" once
// the file is unlinked, and by what its path names now.
func (l *Link) checkFiles() []error {
	m := l.manifest
	var errs []error
	deleted := map[string]bool{}
	for _, u := range l.units {
		if u.multi == nil {
			continue
		}
		infos, err := u.multi.Info()
		if err != nil {
			continue
		}
		for _, in := range infos {
			if strings.HasSuffix(in.Path, " (deleted)") {
				deleted[u.files[in.Target].Path] = true
			}
		}
	}
	for _, f := range m.Files {
		var st unix.Stat_t
		err := unix.Stat(f.Path, &st)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: %w: %w", f.Path, ErrFileChanged, err))
		case uint64(st.Dev) != f.Dev || st.Ino != f.Ino:
			errs = append(errs, fmt.Errorf("%s: now inode %d on device %#x, pinned on inode %d on %#x (replaced, as an upgrade does): the pinned links probe the old file, which only processes started before run; resolve and attach again for the new one: %w",
				f.Path, st.Ino, st.Dev, f.Ino, f.Dev, ErrFileChanged))
		case st.Size != f.Size || unix.TimespecToNsec(st.Mtim) != f.MtimeNs:
			errs = append(errs, fmt.Errorf("%s: modified in place since it was pinned (size %d, was %d): %w", f.Path, st.Size, f.Size, ErrFileChanged))
		case deleted[f.Path]:
			errs = append(errs, fmt.Errorf("%s: the file the pinned links hold was deleted: %w", f.Path, ErrFileChanged))
		}
	}
	return errs
}

// StaleFiles returns, for a Link taken back with LoadPinnedLink, an error
// for each binary that changed since it was pinned, wrapping
// ErrFileChanged and saying what changed. Its sites probe the file as it
// was; Resolve and Attach again to probe the new one. Nil for a Link that
// Attach made, or whose binaries are as they were.
func (l *Link) StaleFiles() []error {
	l.state.RLock()
	defer l.state.RUnlock()
	return l.stale
}

// loadGenRetired takes back the map of retired generations pinned in dir,
// or makes (and pins) one where a Link was pinned before there was one: its
// older copies do not read it, and the copies of later updates do.
func loadGenRetired(dir string) (*ebpf.Map, error) {
	path := filepath.Join(dir, pinGenRetired)
	m, err := ebpf.LoadPinnedMap(path, nil)
	if !errors.Is(err, os.ErrNotExist) {
		return m, err
	}
	if m, err = newGenRetired(); err != nil {
		return nil, err
	}
	if err := pinClone(m, path); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// checkPinDir makes dir, a directory on a BPF filesystem, if it is not
// there, and fails if it is not on one, leaving nothing it made.
func checkPinDir(dir string) error {
	_, err := os.Stat(dir)
	made := errors.Is(err, os.ErrNotExist)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		if errors.Is(err, unix.EPERM) {
			err = fmt.Errorf("%w (a BPF filesystem refuses names with a dot)", err)
		}
		return fmt.Errorf("multiprobe: %w", err)
	}
	var st unix.Statfs_t
	err = unix.Statfs(dir, &st)
	if err == nil && uint32(st.Type) != bpfFSMagic {
		err = fmt.Errorf("%s is not on a BPF filesystem (mount one with mount -t bpf bpf /sys/fs/bpf): %w", dir, unix.EINVAL)
	}
	if err != nil {
		if made {
			os.Remove(dir)
		}
		return fmt.Errorf("multiprobe: %w", err)
	}
	return nil
}

// CheckPinDir reports whether Pin can pin in dir: a directory on a BPF
// filesystem, which it makes if it is not there (and removes again if it
// cannot be one). A long-running program checks its pin directory at
// start, before it attaches anything that Pin would then refuse.
func CheckPinDir(dir string) error { return checkPinDir(dir) }
