package elfsym

import (
	"encoding/binary"
	"slices"

	"github.com/multiprobe/multiprobe/internal/glob"
)

const maxSuggestions = 3

// suggest returns the function names closest to the inclusion patterns,
// for a no-match error. It runs only on that error path, so it may read
// every name.
func (r *resolver) suggest() []string {
	type cand struct {
		name string
		dist int
	}
	var best []cand
	for _, np := range r.m.incl {
		want := glob.Literal(np.name.String())
		if want == "" {
			continue
		}
		limit := max(2, len(want)/2)
		consider := func(name []byte) bool {
			if d := glob.Distance(want, name, limit); d <= limit {
				if len(best) < maxSuggestions*4 || d < best[len(best)-1].dist {
					s := string(name)
					if !slices.ContainsFunc(best, func(c cand) bool { return c.name == s }) {
						best = append(best, cand{s, d})
						slices.SortStableFunc(best, func(a, b cand) int { return a.dist - b.dist })
						best = best[:min(len(best), maxSuggestions*4)]
					}
				}
			}
			return true
		}
		for t := range r.f.tables {
			n := len(r.f.tables[t].syms) / symSize
			for i := 0; i < n; i++ {
				e, _, ok := r.funcAt(t, i)
				if !ok {
					continue
				}
				name, _, _ := r.nameAt(t, i, binary.LittleEndian.Uint32(e))
				consider(name)
			}
		}
		if len(r.f.tables) == 0 && r.f.pclntab != nil {
			r.goNames(consider)
		}
	}
	var out []string
	for _, c := range best {
		if len(out) == maxSuggestions {
			break
		}
		out = append(out, c.name)
	}
	return out
}
