package probetest

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
)

// CheckCounts compares the counts a BPF program kept per site with want,
// and fails tb with a table of the sites that differ, by name.
//
// counts is an array (or per-CPU array) map of 64-bit counters indexed by
// the cookie multiprobe gives each site (its index in sites, from
// Plan.Sites or Link.Sites), as a program that does
//
//	__u32 key = mp_cookie(ctx);
//	__u64 *n = bpf_map_lookup_elem(&counts, &key);
//	if (n) __sync_fetch_and_add(n, 1);
//
// keeps them. sites are a multiprobe.Plan's or Link's Sites, whose String
// is "KIND:PATH:NAME" (any fmt.Stringer that names sites so will do: the
// type parameter keeps this package below multiprobe's). want is keyed by
// site name ("malloc", "python:line"), or by kind and name
// ("uretprobe:malloc") where a plan has a function's entry and return;
// sites of one kind and name (a USDT probe's, or one function in several
// files) are summed. A site that want does not name must have 0: a count
// under the wrong cookie shows.
func CheckCounts[S fmt.Stringer](tb testing.TB, sites []S, counts *ebpf.Map, want map[string]uint64) {
	tb.Helper()
	got, err := ReadCounts(sites, counts)
	if err != nil {
		tb.Fatal(err)
	}
	if diff := DiffCounts(got, want); diff != "" {
		tb.Errorf("counts per site differ (-got +want):\n%s", diff)
	}
}

// ReadCounts reads the per-site counts of counts (see [CheckCounts]) into
// a map keyed by kind and name ("uprobe:malloc", "usdt:python:line"), a
// USDT probe's sites summed. The cookie of sites[i] is i.
func ReadCounts[S fmt.Stringer](sites []S, counts *ebpf.Map) (map[string]uint64, error) {
	perCPU := counts.Type() == ebpf.PerCPUArray
	if t := counts.Type(); t != ebpf.Array && !perCPU || counts.ValueSize() != 8 {
		return nil, errorf("counts map %v: want an array or per-CPU array of 64-bit values, not a %v of %d-byte values", counts, t, counts.ValueSize())
	}
	if int(counts.MaxEntries()) < len(sites) {
		return nil, errorf("counts map %v has %d entries for %d sites: make it at least that large", counts, counts.MaxEntries(), len(sites))
	}
	got := make(map[string]uint64, len(sites))
	for i, s := range sites {
		var n uint64
		if perCPU {
			var per []uint64
			if err := counts.Lookup(uint32(i), &per); err != nil {
				return nil, errorf("reading the count of site %d (%s): %w", i, s, err)
			}
			for _, v := range per {
				n += v
			}
		} else if err := counts.Lookup(uint32(i), &n); err != nil {
			return nil, errorf("reading the count of site %d (%s): %w", i, s, err)
		}
		got[kindAndName(s.String())] += n
	}
	return got, nil
}

// DiffCounts returns the counts of got (keyed by kind and name, as
// ReadCounts returns them) that differ from want (keyed by name, or kind
// and name), a line each, or "" if none do.
func DiffCounts(got, want map[string]uint64) string {
	// want's plain names stand for any kind; a name two kinds share must
	// be given with its kind.
	expect := map[string]uint64{}
	var b strings.Builder
	for key, n := range want {
		if _, ok := got[key]; ok {
			expect[key] = n
			continue
		}
		matched := 0
		for g := range got {
			if _, name, _ := strings.Cut(g, ":"); name == key {
				expect[g] = n
				matched++
			}
		}
		switch matched {
		case 0:
			fmt.Fprintf(&b, "  %s: no such site\n", key)
		case 1:
		default:
			fmt.Fprintf(&b, "  %s: %d sites of different kinds have that name: give the kind too (uprobe:%s)\n", key, matched, key)
		}
	}
	keys := make([]string, 0, len(got))
	for k := range got {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if got[k] != expect[k] {
			fmt.Fprintf(&b, "  %s: -%d +%d\n", k, got[k], expect[k])
		}
	}
	return b.String()
}

// kindAndName drops the path from a site's "KIND:PATH:NAME": a USDT
// probe's name is its last two fields (PROVIDER:NAME), a function's its
// last.
func kindAndName(site string) string {
	kind, rest, _ := strings.Cut(site, ":")
	fields := strings.Split(rest, ":")
	n := 1
	if kind == "usdt" && len(fields) > 2 {
		n = 2
	}
	return kind + ":" + strings.Join(fields[len(fields)-n:], ":")
}
