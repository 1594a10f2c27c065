package fallback

import (
	"debug/elf"
	"errors"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/kernelprobe"
)

// buildSema returns the semaphore target (testprogs' c/sema.c) built as a
// PIE ("pie") or not ("nopie").
func buildSema(t testing.TB, kind string) string {
	t.Helper()
	return testprogs.SemaTarget(t, kind == "pie")
}

// symOffset returns the file offset of symbol name in the ELF file at path.
func symOffset(t testing.TB, path, name string) uint64 {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range syms {
		if s.Name != name || s.Section == elf.SHN_UNDEF {
			continue
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_LOAD && s.Value >= p.Vaddr && s.Value-p.Vaddr < p.Filesz {
				return s.Value - p.Vaddr + p.Off
			}
		}
	}
	t.Fatalf("%s: no symbol %s in a PT_LOAD segment", path, name)
	return 0
}

// semaFuncs returns the offsets of fn0, fn1, fn2: fn i is called n+i times
// by "c n".
func semaFuncs(t testing.TB, path string) []uint64 {
	return []uint64{symOffset(t, path, "fn0"), symOffset(t, path, "fn1"), symOffset(t, path, "fn2")}
}

// cookieCounter is testdata/cookiecount.c, loaded for the perf-event path.
type cookieCounter struct {
	coll   *ebpf.Collection
	prog   *ebpf.Program
	counts *ebpf.Map
	misses *ebpf.Map
}

func loadCookieCounter(t testing.TB) *cookieCounter {
	t.Helper()
	spec, err := loadCookiecount()
	if err != nil {
		t.Fatal(err)
	}
	kernelprobe.PrepareCollectionSpec(spec, kernelprobe.PathPerfEvent)
	if err := testprogs.FixCookieWithoutKernelCookies(spec); err != nil {
		t.Fatal(err)
	}
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			t.Fatalf("%+v", ve)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { coll.Close() })
	return &cookieCounter{coll: coll, prog: coll.Programs["count_cookie"], counts: coll.Maps["cookie_counts"],
		misses: coll.Maps["cookie_misses"]}
}

// clones loads one copy of count_cookie per cookie, each with its cookie
// built in as bpf/mp_cookie.bpf.h's constant and sharing c's maps: the
// programs a kernel without BPF cookies gets (the root package makes them
// the same way through package load).
func (c *cookieCounter) clones(t testing.TB, cookies []uint64) []*ebpf.Program {
	t.Helper()
	var progs []*ebpf.Program
	for _, ck := range cookies {
		spec, err := loadCookiecount()
		if err != nil {
			t.Fatal(err)
		}
		kernelprobe.PrepareCollectionSpec(spec, kernelprobe.PathPerfEvent)
		if err := testprogs.FixCookie(spec, ck); err != nil {
			t.Fatal(err)
		}
		var objs struct {
			Prog *ebpf.Program `ebpf:"count_cookie"`
		}
		err = spec.LoadAndAssign(&objs, &ebpf.CollectionOptions{MapReplacements: map[string]*ebpf.Map{
			"cookie_counts": c.counts, "cookie_misses": c.misses,
		}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { objs.Prog.Close() })
		progs = append(progs, objs.Prog)
	}
	return progs
}

func (c *cookieCounter) count(t testing.TB, cookie uint32) uint64 {
	t.Helper()
	var n uint64
	if err := c.counts.Lookup(cookie, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (c *cookieCounter) missed(t testing.TB) uint64 {
	t.Helper()
	var n uint64
	if err := c.misses.Lookup(uint32(0), &n); err != nil {
		t.Fatal(err)
	}
	return n
}

func features(t testing.TB, edit func(*kernelprobe.Features)) *kernelprobe.Features {
	t.Helper()
	f, err := kernelprobe.Detect()
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(&f)
	}
	return &f
}

// siteOptions returns the Options that give the sites of a target these
// cookies on this kernel: its BPF cookies, or, without them (before Linux
// 5.15), a clone of count_cookie per site with the cookie built in.
func (c *cookieCounter) siteOptions(t testing.TB, cookies []uint64) *Options {
	t.Helper()
	f := features(t, nil)
	if f.Cookies {
		return &Options{Features: f}
	}
	return &Options{Features: f, Programs: c.clones(t, cookies)}
}
