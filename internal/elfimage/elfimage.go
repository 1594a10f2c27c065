// Package elfimage turns the virtual addresses of an ELF file into the file
// offsets that the kernel's uprobe interfaces take, through the file's
// PT_LOAD program headers: off = vaddr - p_vaddr + p_offset. Section
// headers, which libbpf uses, give wrong offsets on some linker layouts;
// the program headers are what the loader maps. Package elfsym converts
// function symbols with it and package usdt probe locations and
// semaphores.
package elfimage

import (
	"debug/elf"
	"errors"
	"fmt"
)

// ErrNotELF: the file is not an ELF file at all. Packages elfsym and usdt
// export it, so that errors.Is tells it with either one's name.
var ErrNotELF = errors.New("not an ELF file")

// ErrTruncated: a PT_LOAD segment reaches past the end of the file, so
// addresses in it would get offsets the kernel refuses.
var ErrTruncated = errors.New("PT_LOAD segment past the end of the file")

// A Segment is one PT_LOAD program header.
type Segment struct {
	Vaddr, Memsz   uint64
	Offset, Filesz uint64
	Exec           bool // PF_X: code
}

// An Image is the loadable segments of a file, in header order.
type Image []Segment

// Load keeps the PT_LOAD headers of progs.
func Load(progs []*elf.Prog) Image {
	var im Image
	for _, p := range progs {
		if p.Type == elf.PT_LOAD {
			im = append(im, Segment{Vaddr: p.Vaddr, Memsz: p.Memsz, Offset: p.Off, Filesz: p.Filesz, Exec: p.Flags&elf.PF_X != 0})
		}
	}
	return im
}

// Within checks that every segment's file part lies inside a file of size
// bytes.
func (im Image) Within(size uint64) error {
	for _, s := range im {
		if s.Offset > size || s.Filesz > size-s.Offset {
			return fmt.Errorf("%w: PT_LOAD at offset %#x size %#x, file %d bytes: truncated?", ErrTruncated, s.Offset, s.Filesz, size)
		}
	}
	return nil
}

// Code returns the file offset of code at vaddr: inside the file part of
// an executable segment. It is the hot path of symbol resolution, so it
// reports failure with a bool.
func (im Image) Code(vaddr uint64) (uint64, bool) {
	for i := range im {
		s := &im[i]
		if s.Exec && vaddr >= s.Vaddr && vaddr-s.Vaddr < s.Filesz {
			return vaddr - s.Vaddr + s.Offset, true
		}
	}
	return 0, false
}

// Offset returns the file offset of vaddr, which must lie in an executable
// segment's file part for code, or in a non-executable segment for data
// (such as a USDT semaphore, which may lie in the zero-filled tail past the
// file part: the kernel counts it in the mapped page all the same).
func (im Image) Offset(vaddr uint64, code bool) (uint64, error) {
	for _, s := range im {
		size := s.Filesz
		if !code {
			size = s.Memsz
		}
		if vaddr < s.Vaddr || vaddr-s.Vaddr >= size {
			continue
		}
		if s.Exec != code {
			want := "an executable"
			if !code {
				want = "a non-executable"
			}
			return 0, fmt.Errorf("in a segment with flags %s, want %s one", flags(s.Exec), want)
		}
		return vaddr - s.Vaddr + s.Offset, nil
	}
	return 0, errors.New("not in any PT_LOAD segment")
}

func flags(exec bool) string {
	if exec {
		return "X"
	}
	return "not X"
}
