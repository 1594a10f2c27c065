package glob

import "testing"

func TestDistance(t *testing.T) {
	for _, tt := range []struct {
		a, b  string
		limit int
		want  int
	}{
		{"malloc", "malloc", 2, 0},
		{"Malloc", "malloc", 2, 0},
		{"mallco", "malloc", 2, 2},
		{"mallo", "malloc", 2, 1},
		{"free", "malloc", 2, 3}, // past the limit: limit+1
		{"a", "abcdefgh", 2, 3},
		{"", "", 1, 0},
	} {
		if got := Distance(tt.a, []byte(tt.b), tt.limit); got != tt.want {
			t.Errorf("Distance(%q, %q, %d) = %d, want %d", tt.a, tt.b, tt.limit, got, tt.want)
		}
	}
	if got := Literal("py*:func[ab]?!x"); got != "py:funcabx" {
		t.Errorf("Literal = %q", got)
	}
}
