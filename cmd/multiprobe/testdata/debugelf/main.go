// Command debugelf is what BenchmarkListProcess compares multiprobe list
// with: the standard library's way, decoding every symbol with debug/elf
// and matching each name against a pattern.
package main

import (
	"debug/elf"
	"fmt"
	"os"
	"path"
)

func main() {
	ef, err := elf.Open(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	n := 0
	syms, _ := ef.Symbols()
	dyn, _ := ef.DynamicSymbols()
	for _, s := range append(syms, dyn...) {
		if elf.ST_TYPE(s.Info) != elf.STT_FUNC || s.Value == 0 {
			continue
		}
		if ok, _ := path.Match(os.Args[2], s.Name); ok {
			fmt.Printf("%s\t%#x\t%d\n", s.Name, s.Value, s.Size)
			n++
		}
	}
	fmt.Println(n, "sites")
}
