package elfsym

import (
	"encoding/binary"
	"slices"
	"strings"
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
		want := strings.Map(func(c rune) rune {
			if strings.ContainsRune("*?[]!", c) {
				return -1
			}
			return c
		}, np.name.String())
		if want == "" {
			continue
		}
		limit := max(2, len(want)/2)
		consider := func(name []byte) bool {
			if d := distance(want, name, limit); d <= limit {
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

// distance is the edit distance between a and b, or limit+1 once it is
// known to exceed limit. Case differences cost nothing: "Malloc" should
// suggest "malloc".
func distance(a string, b []byte, limit int) int {
	if d := len(a) - len(b); d > limit || -d > limit {
		return limit + 1
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		rowMin := cur[0]
		for j := 1; j <= len(b); j++ {
			cost := 1
			if lower(a[i-1]) == lower(b[j-1]) {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			rowMin = min(rowMin, cur[j])
		}
		if rowMin > limit {
			return limit + 1
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}
