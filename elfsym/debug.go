package elfsym

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/multiprobe/multiprobe/internal/fds"
	"github.com/ulikunitz/xz"
)

// Options are OpenFileOptions' options.
type Options struct {
	// DebugDirs are the directories searched for a stripped file's
	// separate debug file, as GDB's debug-file-directory: nil means
	// DefaultDebugDir alone, and an empty, non-nil slice none.
	DebugDirs []string
}

// DefaultDebugDir is where distributions install separate debug files.
const DefaultDebugDir = "/usr/lib/debug"

// ErrStaleDebugFile is wrapped by the error for a separate debug file that
// belongs to another build of the file: its symbols' addresses would be
// another build's.
var ErrStaleDebugFile = errors.New("debug file does not match the binary")

// maxDebugData bounds what a .gnu_debugdata section decompresses to: a
// hostile file could claim gigabytes. Fedora's largest are a few MB.
const maxDebugData = 256 << 20

// readDebugRefs keeps what points f to its debug information: its build
// ID, its .gnu_debuglink and its .gnu_debugdata, copied out of the file's
// mapping, which OpenFile lets go.
func (f *File) readDebugRefs(ef *elf.File) error {
	for _, s := range ef.Sections {
		switch {
		case s.Type == elf.SHT_NOTE && s.Name == ".note.gnu.build-id":
			b, err := f.section(s)
			if err != nil {
				return err
			}
			f.buildID = bytes.Clone(buildID(b))
		case s.Name == ".gnu_debuglink":
			b, err := f.section(s)
			if err != nil {
				return err
			}
			// A NUL-terminated name, padded to 4 bytes, then a CRC-32.
			name, _, ok := bytes.Cut(b, []byte{0})
			if !ok || len(b) < 4 {
				continue
			}
			f.debugLink = filepath.Base(string(name))
			f.debugCRC = binary.LittleEndian.Uint32(b[len(b)-4:])
		case s.Name == ".gnu_debugdata":
			b, err := f.section(s)
			if err != nil {
				return err
			}
			f.debugData = bytes.Clone(b)
		}
	}
	return nil
}

// ntGNUBuildID is the type of the GNU build ID note, which debug/elf does
// not name.
const ntGNUBuildID = 3

// buildID returns the description of the NT_GNU_BUILD_ID note in notes.
func buildID(notes []byte) []byte {
	le := binary.LittleEndian
	for len(notes) >= 12 {
		namesz, descsz, typ := le.Uint32(notes), le.Uint32(notes[4:]), le.Uint32(notes[8:])
		name := uint64(namesz+3) &^ 3
		desc := uint64(descsz+3) &^ 3
		if 12+name+desc > uint64(len(notes)) {
			return nil
		}
		if typ == ntGNUBuildID && bytes.Equal(notes[12:12+namesz], []byte("GNU\x00")) {
			return notes[12+name : 12+name+uint64(descsz)]
		}
		notes = notes[12+name+desc:]
	}
	return nil
}

// addDebugSymbols reads the symbols of f's debug information into f, when
// f has no .symtab: see OpenFileOptions.
func (f *File) addDebugSymbols(fd *os.File, opts *Options) error {
	if !f.stripped() || f.pclntab != nil {
		return nil
	}
	if f.debugData != nil {
		return f.addMiniDebugInfo()
	}
	dirs := []string{DefaultDebugDir}
	if opts != nil && opts.DebugDirs != nil {
		dirs = opts.DebugDirs
	}
	for _, p := range f.debugPaths(dirs) {
		dfd, err := fds.OpenRegular(p)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
			continue
		}
		if err != nil {
			return fmt.Errorf("%s: debug file: %w", f.path, err)
		}
		err = f.adoptDebugFile(dfd)
		dfd.Close()
		return err
	}
	return nil
}

// debugPaths are where f's separate debug file may be, in GDB's order.
func (f *File) debugPaths(dirs []string) []string {
	// A file in another process's root has its debug files there too:
	// the paths are that root's, opened confined to it (fds.OpenRegular).
	root, rest, inProc := fds.SplitProcRoot(f.path)
	dir := filepath.Dir(f.path)
	if inProc {
		dir = filepath.Dir("/" + rest)
	}
	var out []string
	if len(f.buildID) >= 2 {
		id := hex.EncodeToString(f.buildID)
		for _, d := range dirs {
			out = append(out, root+filepath.Join(d, ".build-id", id[:2], id[2:]+".debug"))
		}
	}
	if f.debugLink != "" {
		out = append(out, root+filepath.Join(dir, f.debugLink), root+filepath.Join(dir, ".debug", f.debugLink))
		for _, d := range dirs {
			out = append(out, root+filepath.Join(d, dir, f.debugLink))
		}
	}
	return out
}

// adoptDebugFile reads the symbol tables of the debug file open as dfd
// into f, if it is f's.
func (f *File) adoptDebugFile(dfd *os.File) error {
	if dfd.Name() == f.path {
		return nil // .gnu_debuglink naming the file itself
	}
	d, err := openFile(dfd, true)
	if err != nil {
		return fmt.Errorf("%s: debug file: %w", f.path, err)
	}
	defer d.Close()
	switch {
	case f.buildID != nil:
		if !bytes.Equal(d.buildID, f.buildID) {
			return fmt.Errorf("%s has build ID %x, %s has %x: %w (remove it, or install the debug package of the installed version)",
				f.path, f.buildID, dfd.Name(), d.buildID, ErrStaleDebugFile)
		}
	default:
		h := crc32.NewIEEE()
		if _, err := io.Copy(h, io.NewSectionReader(dfd, 0, 1<<62)); err != nil {
			return fmt.Errorf("%s: debug file %s: %w", f.path, dfd.Name(), err)
		}
		if h.Sum32() != f.debugCRC {
			return fmt.Errorf("%s wants a debug file with CRC %#08x, %s has %#08x: %w", f.path, f.debugCRC, dfd.Name(), h.Sum32(), ErrStaleDebugFile)
		}
	}
	f.adopt(d, dfd.Name())
	return nil
}

// addMiniDebugInfo reads the symbols of f's .gnu_debugdata.
func (f *File) addMiniDebugInfo() error {
	r, err := xz.NewReader(bytes.NewReader(f.debugData))
	if err != nil {
		return fmt.Errorf("%s: .gnu_debugdata: %w: %w", f.path, ErrMalformed, err)
	}
	data, err := io.ReadAll(io.LimitReader(r, maxDebugData+1))
	if err != nil {
		return fmt.Errorf("%s: .gnu_debugdata: %w: %w", f.path, ErrMalformed, err)
	}
	if len(data) > maxDebugData {
		return fmt.Errorf("%s: .gnu_debugdata: %w: decompresses to more than %d bytes", f.path, ErrUnsupported, maxDebugData)
	}
	d, err := newFile(f.path+"[.gnu_debugdata]", data, true)
	if err != nil {
		return err
	}
	f.adopt(d, d.path)
	f.debugData = nil
	return nil
}

// adopt takes the .symtab tables of d, a debug file of f, with the
// mappings that hold them; d is left without them.
func (f *File) adopt(d *File, name string) {
	var symtabs []symtab
	for _, t := range d.tables {
		if !t.dynamic {
			symtabs = append(symtabs, t)
		}
	}
	if len(symtabs) == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	f.tables = append(symtabs, f.tables...)
	f.maps = append(f.maps, d.maps...)
	d.maps, d.tables = nil, nil
	f.debugFile = name
}

// DebugFile names the file whose symbols completed f's (see
// OpenFileOptions), or is "" if none did.
func (f *File) DebugFile() string { return f.debugFile }
