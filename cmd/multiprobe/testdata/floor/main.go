// Command floor is the floor of BenchmarkListProcess: a process that maps
// an ELF file and touches every page of its symbol and string tables, and
// does nothing else. A lookup cannot take less than reading those pages.
package main

import (
	"debug/elf"
	"fmt"
	"os"
	"syscall"
)

func main() {
	f, err := os.Open(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	st, _ := f.Stat()
	data, err := syscall.Mmap(int(f.Fd()), 0, int(st.Size()), syscall.PROT_READ, syscall.MAP_PRIVATE)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ef, err := elf.NewFile(f)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sum := 0
	for _, s := range ef.Sections {
		switch s.Name {
		case ".symtab", ".strtab", ".dynsym", ".dynstr":
			for off := s.Offset; off < s.Offset+s.Size; off += 4096 {
				sum += int(data[off])
			}
		}
	}
	fmt.Println(sum)
}
