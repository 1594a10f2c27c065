package glob

import (
	"errors"
	"path"
	"testing"
)

func TestMatch(t *testing.T) {
	tests := []struct {
		pattern, name string
		want          bool
	}{
		{"func_*", "func_1", true},
		{"func_*", "func_", true},
		{"func_*", "xfunc_1", false},
		{"*", "", true},
		{"*", "main.(*T).Run", true},
		{"main.*", "main.(*T).Run", true},
		{"ns::*", "ns::a::f", true},
		{"*::f", "ns::a::f", true},
		{"sh_?et*", "sh_get_var", true},
		{"sh_?et*", "sh_set", true},
		{"sh_?et*", "sh_et", false},
		{"f[abc]", "fb", true},
		{"f[abc]", "fd", false},
		{"f[a-c]x", "fcx", true},
		{"f[!x]", "fy", true},
		{"f[!x]", "fx", false},
		{"f[^x]", "fx", false},
		{"f[]]", "f]", true},
		{"f[!]]", "f]", false},
		{`f\*`, "f*", true},
		{`f\*`, "fx", false},
		{"a*b*c", "axxbyyc", true},
		{"a*b*c", "axxbyy", false},
		{"*a", "bbba", true},
		{"*a*", "bab", true},
		{"a?", "a", false},
		{"exact", "exact", true},
		{"exact", "exact2", false},
		{"python:function__*", "python:function__entry", true},
		{"*:*", "libc:setjmp", true},
		{"*:*", "nocolon", false},
		{"*[0-9]", "f9", true},
		{"**x", "ax", true},
	}
	for _, tt := range tests {
		p, err := Compile(tt.pattern)
		if err != nil {
			t.Fatalf("Compile(%q): %v", tt.pattern, err)
		}
		if got := p.MatchString(tt.name); got != tt.want {
			t.Errorf("%q.Match(%q) = %v, want %v", tt.pattern, tt.name, got, tt.want)
		}
	}
}

func TestBadPattern(t *testing.T) {
	for _, p := range []string{"[", "f[abc", `f\`, "[!"} {
		if _, err := Compile(p); !errors.Is(err, ErrBadPattern) {
			t.Errorf("Compile(%q) = %v, want ErrBadPattern", p, err)
		}
	}
}

func TestMatchAllocs(t *testing.T) {
	p := MustCompile("a*[bc]?d*")
	name := []byte("axxxbyd_zz")
	if n := testing.AllocsPerRun(100, func() { p.Match(name) }); n != 0 {
		t.Errorf("Match allocates %v times", n)
	}
}

// FuzzMatch checks that matching never panics and agrees with path.Match on
// names and patterns without '/', where both define the same language.
func FuzzMatch(f *testing.F) {
	f.Add("func_*", "func_1")
	f.Add("a*[bc]?d*", "axxxbyd")
	f.Add("[!a-c]*", "d")
	f.Fuzz(func(t *testing.T, pattern, name string) {
		p, err := Compile(pattern)
		if err != nil {
			return
		}
		got := p.MatchString(name)
		for i := 0; i < len(pattern); i++ {
			switch pattern[i] {
			case '/', '\\', '^', '-', ']':
				// path.Match differs: '/' is special, '^' is not a
				// negation, and it parses ranges and escapes in classes
				// more strictly.
				return
			}
		}
		for i := 0; i < len(name); i++ {
			if name[i] == '/' || name[i] >= 0x80 {
				return
			}
		}
		want, err := path.Match(pattern, name)
		if err != nil {
			return
		}
		if got != want {
			t.Errorf("%q.Match(%q) = %v, path.Match says %v", pattern, name, got, want)
		}
	})
}

func TestNeedle(t *testing.T) {
	for _, tt := range []struct{ pattern, want string }{
		{"func_*", "func_"},
		{"*_func_0001??", "_func_0001"},
		{"*suffix", "suffix"},
		{"a*longer_part*b", "longer_part"},
		{"*", ""},
		{"?*", ""},
		{`x\*yz*`, "x*yz"},
		{"exact", "exact"},
	} {
		if got := string(MustCompile(tt.pattern).Needle()); got != tt.want {
			t.Errorf("%q.Needle() = %q, want %q", tt.pattern, got, tt.want)
		}
	}
}
