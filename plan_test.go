package multiprobe

import (
	"slices"
	"testing"

	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/kernelprobe"
)

// TestOneSiteTable resolves probes of every kind over one binary, some
// selecting sites an earlier probe has, and checks that every consumer of
// the plan's rows numbers the sites alike: each cookie the kernel's
// targets carry names the Site with that index, at that offset (or its
// returns'), of a kind that attaches there, each site exactly once; the
// USDT sites' spec ids go to the USDT sites in their order.
func TestOneSiteTable(t *testing.T) {
	target := testprogs.USDTTarget(t)
	probes, err := ParseProbes(
		"usdt:"+target+":mp:*",
		"uprobe:"+target+":*",
		"uretprobe:"+target+":main",
		"uprobe:"+target+":main", // main again: no new site
		"usdt:"+target+":mp:guarded",
	)
	if err != nil {
		t.Fatal(err)
	}
	f := kernelprobe.Features{Release: "6.18.0", UprobeMulti: true, UprobeMultiPIDFilter: true, Cookies: true, RefCtrOffset: true, UprobePMU: true}
	pl, err := Resolve(probes, &Options{Features: &f})
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Close()
	sites := pl.Sites()
	if len(sites) != pl.Len() || len(sites) < 4 {
		t.Fatalf("%d sites, Len %d", len(sites), pl.Len())
	}
	t.Logf("%d sites", len(sites))
	var usdtSites []int
	for i, s := range sites {
		if s.Cookie != uint64(i) {
			t.Errorf("site %d (%s): cookie %d", i, s.Name, s.Cookie)
		}
		if s.USDT != nil {
			usdtSites = append(usdtSites, i)
		}
	}
	seen := make([]int, len(sites))
	var usdtOrder []int
	for _, kind := range []Kind{Entry, Return} {
		targets := pl.targets(kind, func(i int, c uint64) uint64 {
			if i != len(usdtOrder) {
				t.Errorf("USDT site %d numbered %d", len(usdtOrder), i)
			}
			usdtOrder = append(usdtOrder, int(c))
			return c
		})
		for _, tg := range targets {
			for j, off := range tg.Offsets {
				c := tg.Cookies[j]
				if c >= uint64(len(sites)) {
					t.Fatalf("%s: cookie %d of %d sites", kind, c, len(sites))
				}
				s := sites[c]
				if s.Probe.Kind.attachAs() != kind && s.Returns == nil {
					t.Errorf("%s link has site %d, a %s", kind, c, s.Probe.Kind)
				}
				if s.Offset != off && !slices.Contains(s.Returns, off) {
					t.Errorf("%s link: cookie %d at %#x, but site %d (%s) is at %#x", kind, c, off, c, s.Name, s.Offset)
				}
				if tg.Path != s.Path {
					t.Errorf("site %d: in %s's target, but of %s", c, tg.Path, s.Path)
				}
				if s.Returns == nil || j == 0 || tg.Cookies[j-1] != c {
					seen[c]++
				}
			}
		}
	}
	for c, n := range seen {
		if n != 1 {
			t.Errorf("site %d (%s %s) in %d targets' offsets", c, sites[c].Probe.Kind, sites[c].Name, n)
		}
	}
	if !slices.Equal(usdtOrder, usdtSites) {
		t.Errorf("USDT sites numbered %v, want %v", usdtOrder, usdtSites)
	}
}

// TestMergedNames: one site reached by several probes, by the same name
// or by an alias's, is one row, named as the first probe named it, with
// the other names in Names.
func TestMergedNames(t *testing.T) {
	target := testprogs.PrivateTarget(t, 5) // a size the test VMs prebuild
	f := kernelprobe.Features{Release: "6.18.0", UprobeMulti: true, UprobeMultiPIDFilter: true, Cookies: true, RefCtrOffset: true, UprobePMU: true}
	for _, tc := range []struct {
		specs []string
		want  [][]string // each site's Names, nil for one name; by Name
	}{
		{[]string{"uprobe:" + target + ":func_*", "uprobe:" + target + ":func_00001"}, [][]string{nil, nil, nil, nil, nil}},
		{[]string{"uprobe:libc.so.6:fread", "uprobe:libc.so.6:_IO_fread"}, [][]string{{"fread", "_IO_fread"}}},
		// The second probe's site is named as elfsym names a site that
		// two patterns match: _IO_fread again.
		{[]string{"uprobe:libc.so.6:_IO_fread", "uprobe:libc.so.6:fread,_IO_fread"}, [][]string{nil}},
		// Another kind is another site.
		{[]string{"uprobe:libc.so.6:fread", "uretprobe:libc.so.6:_IO_fread"}, [][]string{nil, nil}},
	} {
		pl, err := Resolve(mustParseProbes(t, tc.specs...), &Options{Features: &f})
		if err != nil {
			t.Fatal(err)
		}
		sites := pl.Sites()
		pl.Close()
		var got [][]string
		for _, s := range sites {
			got = append(got, s.Names)
		}
		if !slices.EqualFunc(got, tc.want, slices.Equal) {
			t.Errorf("%q: names %q, want %q", tc.specs, got, tc.want)
		}
	}
}

func mustParseProbes(t *testing.T, specs ...string) []Probe {
	t.Helper()
	probes, err := ParseProbes(specs...)
	if err != nil {
		t.Fatal(err)
	}
	return probes
}
