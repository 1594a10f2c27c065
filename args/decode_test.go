package args

import (
	"testing"

	"github.com/multiprobe/multiprobe"
)

// FuzzDecode feeds args.c's record decoder any bytes: it must not panic,
// and a hit it takes names one of the sites, with no more arguments than
// its kind carries.
func FuzzDecode(f *testing.F) {
	probe := &multiprobe.Probe{Kind: multiprobe.Entry, Target: "/bin/true", Patterns: []string{"f"}}
	ret := &multiprobe.Probe{Kind: multiprobe.Return, Target: "/bin/true", Patterns: []string{"f"}}
	ut := &multiprobe.Probe{Kind: multiprobe.USDT, Target: "/bin/true", Patterns: []string{"p:n"}}
	t := &Tracer{nargs: MaxFuncArgs, strs: []int{0, 1, Ret}, goFile: map[string]bool{}, sites: map[uint32]multiprobe.Site{
		0: {Name: "f", Probe: probe, Path: "/bin/true"}, 1: {Name: "f", Probe: ret, Path: "/bin/true"}, 2: {Name: "p:n", Probe: ut, Path: "/bin/true"},
	}}
	f.Add(make([]byte, hitSize))
	rec := make([]byte, hitSize)
	rec[0], rec[4], rec[hitStrLensAt] = 2, 3, 4
	f.Add(rec)
	f.Fuzz(func(tt *testing.T, b []byte) {
		h, ok := t.decode(b)
		if !ok {
			return
		}
		if h.Site.Name != "f" && h.Site.Name != "p:n" {
			tt.Fatalf("decoded a hit of %q", h.Site.Name)
		}
		if len(h.Args) > 12 || len(h.Strings) > MaxStrings {
			tt.Fatalf("a hit with %d arguments and %d strings", len(h.Args), len(h.Strings))
		}
	})
}
