package glob

import "strings"

// Distance is the edit distance between a and b, or limit+1 once it is
// known to exceed limit. Case differences cost nothing: "Malloc" should
// suggest "malloc".
func Distance(a string, b []byte, limit int) int {
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

// Literal is pattern without its glob syntax ('*', '?', '[', ']', '!'):
// what a suggestion for a pattern that matched nothing is measured from.
func Literal(pattern string) string {
	return strings.Map(func(c rune) rune {
		if strings.ContainsRune("*?[]!", c) {
			return -1
		}
		return c
	}, pattern)
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}
