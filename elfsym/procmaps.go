package elfsym

import (
	"bytes"
	"strconv"
	"unicode"
)

// mapsLine is one line of /proc/PID/maps.
type mapsLine struct {
	Start, End, PgOff uint64
	Exec              bool
	Major, Minor      uint32
	Inode             uint64
	// Path is the mapped file as the process names it, "" for an
	// anonymous mapping; it may end in " (deleted)".
	Path string
}

// parseMaps parses the text of /proc/PID/maps, skipping lines it cannot read.
func parseMaps(data []byte) []mapsLine {
	var out []mapsLine
	for len(data) > 0 {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		if m, ok := parseMapsLine(line); ok {
			out = append(out, m)
		}
	}
	return out
}

// parseMapsLine parses "start-end perms pgoff major:minor inode [path]".
func parseMapsLine(line []byte) (mapsLine, bool) {
	var m mapsLine
	fields := bytes.Fields(line)
	if len(fields) < 5 {
		return m, false
	}
	lo, hi, ok := bytes.Cut(fields[0], []byte("-"))
	if !ok {
		return m, false
	}
	var err1, err2, err3, err4, err5, err6 error
	m.Start, err1 = strconv.ParseUint(string(lo), 16, 64)
	m.End, err2 = strconv.ParseUint(string(hi), 16, 64)
	m.Exec = len(fields[1]) >= 3 && fields[1][2] == 'x'
	m.PgOff, err3 = strconv.ParseUint(string(fields[2]), 16, 64)
	maj, mnr, ok := bytes.Cut(fields[3], []byte(":"))
	if !ok {
		return m, false
	}
	var v uint64
	v, err4 = strconv.ParseUint(string(maj), 16, 32)
	m.Major = uint32(v)
	v, err5 = strconv.ParseUint(string(mnr), 16, 32)
	m.Minor = uint32(v)
	m.Inode, err6 = strconv.ParseUint(string(fields[4]), 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil || err5 != nil || err6 != nil || m.End < m.Start {
		return mapsLine{}, false
	}
	if len(fields) > 5 {
		// The path is the rest of the line after five fields; it may
		// contain spaces.
		rest := line
		for range 5 {
			// Fields split at these spaces, so five fields and a sixth
			// mean each search finds one.
			rest = bytes.TrimLeftFunc(rest, unicode.IsSpace)
			rest = rest[bytes.IndexFunc(rest, unicode.IsSpace):]
		}
		m.Path = string(bytes.TrimLeftFunc(rest, unicode.IsSpace))
	}
	return m, true
}
