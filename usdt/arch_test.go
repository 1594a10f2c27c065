package usdt

import (
	"bytes"
	"os"
	"runtime"
	"testing"

	"github.com/multiprobe/multiprobe/internal/testprogs"
)

// archCase is what the USDT fixtures, built by gcc for one architecture,
// must show. The forms are those of Debian's gcc at -O2: the table is there
// so that a compiler that changes one is noticed, not trusted.
type archCase struct {
	arch   Arch
	goarch string // a host of this GOARCH builds the fixtures natively
	cc     string // Debian's cross compiler, for every other host
	nop    []byte // the instruction <sys/sdt.h> puts at a site
	// sib is the form of fire_sib's arr[i], the one argument whose form
	// differs between the architectures: a base and an index register
	// where the instruction set addresses that way.
	sib ArgKind
}

var archCases = []archCase{
	{ArchX86_64, "amd64", "x86_64-linux-gnu-gcc", []byte{0x90}, ArgSIB},
	{ArchARM64, "arm64", "aarch64-linux-gnu-gcc", []byte{0x1f, 0x20, 0x03, 0xd5}, ArgReg},
	{ArchRISCV64, "riscv64", "riscv64-linux-gnu-gcc", []byte{0x01, 0x00}, ArgMem}, // c.nop
	{ArchS390X, "s390x", "s390x-linux-gnu-gcc", []byte{0x47, 0x00, 0x00, 0x00}, ArgSIB},
	{ArchPPC64LE, "ppc64le", "powerpc64le-linux-gnu-gcc", []byte{0x00, 0x00, 0x00, 0x60}, ArgSIB},
}

// archCaseOf returns the case of arch.
func archCaseOf(t testing.TB, arch Arch) archCase {
	t.Helper()
	for _, c := range archCases {
		if c.arch == arch {
			return c
		}
	}
	t.Fatalf("no test case for %s", arch)
	return archCase{}
}

// nativeCase returns the case of the machine the tests run on.
func nativeCase(t testing.TB) archCase {
	t.Helper()
	for _, c := range archCases {
		if c.goarch == runtime.GOARCH {
			return c
		}
	}
	t.Fatalf("no USDT test case for %s: add it to archCases", runtime.GOARCH)
	return archCase{}
}

// TestArchForms builds the fixtures with the cross compiler of every
// architecture this package decodes and checks what it decodes from them:
// every probe, every argument string at -O0 and -O2, the sizes and
// signedness the C types give, the constants' values, the forms of the
// table, the NOP at each site and the semaphore. The kernels of most of
// these are not booted anywhere (x86-64 and arm64 are, in CI's VMs): this
// is what is checked of them.
func TestArchForms(t *testing.T) {
	for _, c := range archCases {
		t.Run(c.arch.String(), func(t *testing.T) {
			cc := c.cc
			if c.goarch == runtime.GOARCH {
				cc = "" // the native gcc, whose build the other tests use
			}
			fx := testprogs.USDTFixturesFor(t, cc)
			for _, path := range []string{fx.Exe, fx.ExeO0, fx.ExeNoPIE} {
				f, err := Open(path)
				if err != nil {
					t.Fatal(err)
				}
				if f.Arch != c.arch {
					t.Fatalf("%s: Arch %s, want %s", path, f.Arch, c.arch)
				}
				probes, err := f.Probes("mptest:*")
				if err != nil {
					t.Fatal(err)
				}
				checkSites(t, path, probes)
				checkSemaphore(t, path, probes)
				for _, p := range probes {
					for _, s := range p.Sites {
						checkArgs(t, &p, s)
					}
				}
				if path == fx.Exe {
					checkForms(t, probes, formsOf(c))
				}
			}
		})
	}
}

// formsOf returns the form of an argument each probe of the -O2 build must
// have on the architecture of c.
func formsOf(c archCase) map[string]ArgKind {
	return map[string]ArgKind{
		"consts": ArgConst, "sizes": ArgReg, "twelve": ArgMem, "structp": ArgMem,
		"global": ArgMem, "sib": c.sib,
	}
}

// checkArgs checks a site's arguments against the C types of the fixture
// and that they encode into a Spec.
func checkArgs(t *testing.T, p *Probe, s Site) {
	t.Helper()
	if len(s.Args) != argCounts[p.Name] {
		t.Errorf("%s: %d args from %q, want %d", p, len(s.Args), s.ArgString, argCounts[p.Name])
		return
	}
	// The size and signedness of each argument, from the C types: a
	// negative size is a signed type.
	sizes := map[string][]int{
		"sizes": {-1, 1, -2, 2, -4, 4, -8, 8}, "consts": {-1, 1, -2, 2, -4, 4, -8, 8},
		"structp": {-8, -4, -2}, "sib": {-4, -8}, "global": {-4}, "sema": {-4}, "inlined": {-4},
		"twelve": {-8, -8, -8, -8, -8, -8, -8, -8, -8, -8, -8, -8},
	}[p.Name]
	for i, a := range s.Args {
		want := sizes[i]
		if a.Size != abs(want) || a.Signed != (want < 0) {
			t.Errorf("%s arg %d (%q): %d bytes signed %v, want %d", p, i, s.ArgString, a.Size, a.Signed, want)
		}
	}
	if p.Name == "consts" {
		for i, a := range s.Args {
			if got, want := truncate(a.Value, a.Size, a.Signed), expected("consts")[i]; got != want {
				t.Errorf("%s arg %d (%q): constant %d, want %d", p, i, s.ArgString, got, want)
			}
		}
	}
	if _, err := NewSpec(s.Args); err != nil {
		t.Errorf("%s (%q): %v", p, s.ArgString, err)
	}
}

// truncate is what the BPF side makes of v: its low size bytes, extended
// by the sign or not.
func truncate(v int64, size int, signed bool) int64 {
	shift := 64 - 8*uint(size)
	if signed {
		return v << shift >> shift
	}
	return int64(uint64(v) << shift >> shift)
}

func abs(n int) int { return max(n, -n) }

// checkForms checks that each probe of forms has an argument of its form,
// so that the tests of the other forms cannot silently lose one.
func checkForms(t *testing.T, probes []Probe, forms map[string]ArgKind) {
	t.Helper()
	for _, p := range probes {
		want, ok := forms[p.Name]
		if !ok {
			continue
		}
		found := false
		for _, a := range p.Sites[0].Args {
			found = found || a.Kind == want
		}
		if !found {
			t.Errorf("%s: no %s argument in %q (the compiler emitted another form)", &p, want, p.Sites[0].ArgString)
		}
	}
}

// checkSites checks that every site's file offset holds the architecture's
// NOP and that every argument string decoded.
func checkSites(t *testing.T, path string, probes []Probe) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	nop := archCaseOf(t, f.Arch).nop
	for _, p := range probes {
		for _, s := range p.Sites {
			if s.ArgErr != nil {
				t.Errorf("%s: %v", &p, s.ArgErr)
			}
			if s.Offset+uint64(len(nop)) > uint64(len(data)) || !bytes.Equal(data[s.Offset:s.Offset+uint64(len(nop))], nop) {
				t.Errorf("%s: site %#x: file offset %#x does not hold a NOP (% x)", &p, s.Address, s.Offset, nop)
			}
		}
	}
}
