package glob

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
)

// ErrBadPattern is returned for a malformed pattern, such as an unclosed '['.
var ErrBadPattern = errors.New("bad glob pattern")

// Meta is the set of characters that make a pattern a glob rather than an
// exact name.
const Meta = "*?["

// IsLiteral reports whether pattern has no glob characters.
func IsLiteral(pattern string) bool {
	return !strings.ContainsAny(pattern, Meta)
}

// A Pattern is a compiled glob. The zero value matches nothing.
type Pattern struct {
	src    string
	prefix []byte // literal bytes every match starts with
	suffix []byte // literal bytes every match ends with, when the pattern is prefix + '*' + suffix
	simple bool   // pattern is prefix + '*' + suffix, or a literal
	star   bool   // in a simple pattern: there is a '*' between prefix and suffix
	rest   string // the pattern after prefix, for the general matcher
	// needle is the longest literal run in rest: every match contains
	// it, and bytes.Contains rejects most names far faster than the
	// backtracking matcher.
	needle []byte
	// longest is the longest literal run anywhere in the pattern.
	longest []byte
}

// Compile checks pattern and prepares it for matching.
//
// The syntax: '*' matches any run of bytes, '?' one byte, "[abc]" and
// "[a-z]" a byte in the set, "[!x]" or "[^x]" a byte not in it, and '\'
// quotes the next byte.
func Compile(pattern string) (*Pattern, error) {
	if err := validate(pattern); err != nil {
		return nil, err
	}
	p := &Pattern{src: pattern}
	i := literalLen(pattern)
	p.prefix = []byte(unquote(pattern[:i]))
	p.rest = pattern[i:]
	switch {
	case p.rest == "":
		p.simple = true
	case p.rest[0] == '*':
		tail := strings.TrimLeft(p.rest, "*")
		if literalLen(tail) == len(tail) {
			p.simple, p.star = true, true
			p.suffix = []byte(unquote(tail))
		}
	}
	if !p.simple {
		p.needle = longestLiteral(p.rest)
	}
	p.longest = p.prefix
	if len(p.needle) > len(p.longest) {
		p.longest = p.needle
	}
	if len(p.suffix) > len(p.longest) {
		p.longest = p.suffix
	}
	return p, nil
}

// MustCompile is Compile that panics on a bad pattern, for patterns that are
// constants in the program.
func MustCompile(pattern string) *Pattern {
	p, err := Compile(pattern)
	if err != nil {
		panic(err)
	}
	return p
}

// String returns the source of the pattern.
func (p *Pattern) String() string { return p.src }

// Literal reports whether the pattern has no glob characters, and so matches
// exactly one name.
func (p *Pattern) Literal() bool { return p.simple && !p.star }

// Needle returns the longest run of literal bytes that every match
// contains, empty for patterns like "*" or "?*".
func (p *Pattern) Needle() []byte { return p.longest }

// Prefix returns the literal bytes that every match starts with.
func (p *Pattern) Prefix() []byte { return p.prefix }

// Match reports whether name matches the whole pattern.
func (p *Pattern) Match(name []byte) bool {
	if p == nil || !bytes.HasPrefix(name, p.prefix) {
		return false
	}
	if p.simple {
		if !p.star {
			return len(name) == len(p.prefix)
		}
		return len(name) >= len(p.prefix)+len(p.suffix) && bytes.HasSuffix(name, p.suffix)
	}
	rest := name[len(p.prefix):]
	if len(p.needle) > 0 && !bytes.Contains(rest, p.needle) {
		return false
	}
	return match(p.rest, rest)
}

// longestLiteral returns the longest run of literal bytes in pattern.
func longestLiteral(pattern string) []byte {
	var best, cur []byte
	for i := 0; i < len(pattern); i++ {
		c := pattern[i]
		switch c {
		case '*', '?':
			cur = nil
			continue
		case '[':
			end, _ := classEnd(pattern, i)
			i = end
			cur = nil
			continue
		case '\\':
			i++
			c = pattern[i]
		}
		cur = append(cur, c)
		if len(cur) > len(best) {
			best = cur
		}
	}
	return best
}

// MatchString is Match for a string.
func (p *Pattern) MatchString(name string) bool {
	// The conversion does not allocate: the compiler sees that the slice
	// does not escape.
	return p.Match([]byte(name))
}

// literalLen returns the length of the leading part of pattern that has no
// glob characters (quoted characters count as literal).
func literalLen(pattern string) int {
	for i := 0; i < len(pattern); i++ {
		switch pattern[i] {
		case '*', '?', '[':
			return i
		case '\\':
			i++
		}
	}
	return len(pattern)
}

func unquote(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func validate(pattern string) error {
	for i := 0; i < len(pattern); i++ {
		switch pattern[i] {
		case '\\':
			if i+1 == len(pattern) {
				return fmt.Errorf("%w %q: trailing backslash", ErrBadPattern, pattern)
			}
			i++
		case '[':
			end, ok := classEnd(pattern, i)
			if !ok {
				return fmt.Errorf("%w %q: '[' at %d is not closed", ErrBadPattern, pattern, i)
			}
			i = end
		}
	}
	return nil
}

// classEnd returns the index of the ']' that closes the class starting at
// pattern[start] == '['. A ']' right after "[" or "[!" is a member.
func classEnd(pattern string, start int) (int, bool) {
	i := start + 1
	if i < len(pattern) && (pattern[i] == '!' || pattern[i] == '^') {
		i++
	}
	if i < len(pattern) && pattern[i] == ']' {
		i++
	}
	for ; i < len(pattern); i++ {
		switch pattern[i] {
		case '\\':
			i++
		case ']':
			return i, true
		}
	}
	return 0, false
}

// match is the general matcher: iterative, with one backtracking point for
// the last '*' seen, so its cost is O(len(pattern) * len(name)) at worst and
// it never recurses.
func match(pattern string, name []byte) bool {
	px, nx := 0, 0
	starPx, starNx := -1, 0
	for px < len(pattern) || nx < len(name) {
		if px < len(pattern) {
			switch c := pattern[px]; c {
			case '*':
				starPx, starNx = px, nx
				px++
				continue
			case '?':
				if nx < len(name) {
					px++
					nx++
					continue
				}
			case '[':
				end, _ := classEnd(pattern, px) // validated by Compile
				if nx < len(name) && classMatch(pattern[px+1:end], name[nx]) {
					px = end + 1
					nx++
					continue
				}
			default:
				if c == '\\' {
					px++
					c = pattern[px]
				}
				if nx < len(name) && name[nx] == c {
					px++
					nx++
					continue
				}
			}
		}
		if starPx >= 0 && starNx < len(name) {
			starNx++
			px, nx = starPx+1, starNx
			continue
		}
		return false
	}
	return true
}

func classMatch(class string, b byte) bool {
	negate := false
	if len(class) > 0 && (class[0] == '!' || class[0] == '^') {
		negate = true
		class = class[1:]
	}
	in := false
	for i := 0; i < len(class); i++ {
		lo := class[i]
		if lo == '\\' && i+1 < len(class) {
			i++
			lo = class[i]
		}
		hi := lo
		if i+2 < len(class) && class[i+1] == '-' {
			hi = class[i+2]
			if hi == '\\' && i+3 < len(class) {
				hi = class[i+3]
				i++
			}
			i += 2
		}
		if lo <= b && b <= hi {
			in = true
		}
	}
	return in != negate
}
