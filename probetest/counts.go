package probetest

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
)

// CheckCounts compares the counts a BPF program kept per site with want,
// and fails tb with a "-want" and a "+got" line for each site that differs.
//
// counts is an array (or per-CPU array) map of 64-bit counters indexed by
// the cookie multiprobe gives each site (its index in sites, from
// Plan.Sites or Link.Sites), as a program that does
//
//	__u32 key = mp_cookie(ctx);
//	__u64 *n = bpf_map_lookup_elem(&counts, &key);
//	if (n) __sync_fetch_and_add(n, 1);
//
// keeps them. sites are a multiprobe.Plan's or Link's Sites (any [Site]
// will do: the type parameter keeps this package below multiprobe's, whose
// own tests use it). want is keyed as
// [ReadCounts] keys: by site name ("malloc", "python:line"), and by kind
// and name ("uretprobe:malloc") only for a name that sites of two kinds
// share. A site that want does not name must have 0: a count under the
// wrong cookie shows. The report has a "-" line with want's count and a
// "+" line with the count read for each key that differs, as go-cmp's
// diffs do.
func CheckCounts[S Site](tb testing.TB, sites []S, counts *ebpf.Map, want map[string]uint64) {
	tb.Helper()
	got, err := ReadCounts(sites, counts)
	if err != nil {
		tb.Fatal(err)
	}
	if diff := DiffCounts(got, want); diff != "" {
		tb.Errorf("counts per site differ (-want +got):\n%s", diff)
	}
}

// ReadCounts reads the per-site counts of counts (see [CheckCounts]) into
// a map keyed by site name ("malloc", "python:line"), or by kind and name
// ("uprobe:malloc", "uretprobe:malloc") for a name that sites of two kinds
// share: the keys CheckCounts takes. Sites of one key (a USDT probe's, or
// one function in several files) are summed. The cookie of sites[i] is i.
func ReadCounts[S Site](sites []S, counts *ebpf.Map) (map[string]uint64, error) {
	perCPU := counts.Type() == ebpf.PerCPUArray
	if t := counts.Type(); t != ebpf.Array && !perCPU || counts.ValueSize() != 8 {
		return nil, errorf("counts map %v: want an array or per-CPU array of 64-bit values, not a %v of %d-byte values", counts, t, counts.ValueSize())
	}
	if int(counts.MaxEntries()) < len(sites) {
		return nil, errorf("counts map %v has %d entries for %d sites: make it at least that large", counts, counts.MaxEntries(), len(sites))
	}
	keys := siteKeys(sites)
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
		got[keys[i]] += n
	}
	return got, nil
}

// A Site is what CheckCounts and ReadCounts read of a probed site:
// multiprobe.Site is one.
type Site interface {
	// ProbeKind is the kind of the site's probe: "uprobe", "uretprobe" or
	// "usdt".
	ProbeKind() string
	// SiteName is the function's symbol, or "provider:name" for a USDT
	// site.
	SiteName() string
}

// DiffCounts returns the counts of got (as ReadCounts returns them) that
// differ from want (keyed the same way), in two lines each, as go-cmp
// writes a map's difference ("-\tKEY: WANT" and "+\tKEY: GOT"), or "" if
// none do. A key of want that got lacks is a "-" line that says which key
// to give.
func DiffCounts(got, want map[string]uint64) string {
	keys := make([]string, 0, len(got)+len(want))
	for k := range got {
		keys = append(keys, k)
	}
	for k := range want {
		if _, ok := got[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		g, ok := got[k]
		if !ok {
			fmt.Fprintf(&b, "-\t%s: %d, but there is no such site%s\n", k, want[k], keyHint(k, got))
			continue
		}
		if w := want[k]; g != w {
			fmt.Fprintf(&b, "-\t%s: %d\n+\t%s: %d\n", k, w, k, g)
		}
	}
	return b.String()
}

// keyHint says why key, which got lacks, may be a site's all the same:
// given with a kind its name does not need, or without one it does.
func keyHint(key string, got map[string]uint64) string {
	if kind, name, ok := strings.Cut(key, ":"); ok && isKind(kind) {
		if _, ok := got[name]; ok {
			return fmt.Sprintf(" (its key is %s: the kind goes only before a name that two kinds share)", name)
		}
	}
	var kinded []string
	for k := range got {
		if kind, name, ok := strings.Cut(k, ":"); ok && isKind(kind) && name == key {
			kinded = append(kinded, k)
		}
	}
	if len(kinded) > 0 {
		slices.Sort(kinded)
		return fmt.Sprintf(" (sites of %d kinds have that name: give %s)", len(kinded), strings.Join(kinded, " or "))
	}
	return ""
}

func isKind(s string) bool { return s == "uprobe" || s == "uretprobe" || s == "usdt" }

// siteKeys returns each site's key in ReadCounts' map: its name, or
// KIND:NAME where sites of two kinds share the name.
func siteKeys[S Site](sites []S) []string {
	kinds := make([]string, len(sites))
	names := make([]string, len(sites))
	first := map[string]string{} // name -> the first kind seen
	shared := map[string]bool{}
	for i, s := range sites {
		kinds[i], names[i] = s.ProbeKind(), s.SiteName()
		if k, ok := first[names[i]]; !ok {
			first[names[i]] = kinds[i]
		} else if k != kinds[i] {
			shared[names[i]] = true
		}
	}
	for i := range names {
		if shared[names[i]] {
			names[i] = kinds[i] + ":" + names[i]
		}
	}
	return names
}
