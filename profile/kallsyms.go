package profile

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
)

// kernelSymbols names kernel addresses by the functions in
// /proc/kallsyms, which includes BPF programs and trampolines. Reading
// it takes root; without it, addresses stay numbers.
type kernelSymbols struct {
	addrs []uint64 // sorted
	names []string
}

func readKernelSymbols() *kernelSymbols {
	ks := &kernelSymbols{}
	f, err := os.Open("/proc/kallsyms")
	if err != nil {
		return ks
	}
	defer f.Close()
	type sym struct {
		addr uint64
		name string
	}
	var syms []sym
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// "ffffffff81000000 T _stext", with " [module]" after some.
		fields := bytes.Fields(sc.Bytes())
		if len(fields) < 3 || len(fields[1]) != 1 {
			continue
		}
		switch fields[1][0] {
		case 't', 'T', 'w', 'W':
		default:
			continue
		}
		addr, err := strconv.ParseUint(string(fields[0]), 16, 64)
		if err != nil || addr == 0 { // 0: the addresses are hidden
			continue
		}
		syms = append(syms, sym{addr, string(fields[2])})
	}
	sort.Slice(syms, func(i, j int) bool { return syms[i].addr < syms[j].addr })
	for _, s := range syms {
		ks.addrs = append(ks.addrs, s.addr)
		ks.names = append(ks.names, s.name)
	}
	return ks
}

// name returns the function addr is in: the last symbol at or before it.
func (ks *kernelSymbols) name(addr uint64) string {
	i, found := slices.BinarySearch(ks.addrs, addr)
	if !found {
		i--
	}
	if i < 0 {
		return fmt.Sprintf("%#x", addr)
	}
	return ks.names[i]
}
