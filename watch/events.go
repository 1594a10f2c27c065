package watch

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
)

// eventKind is what happened to a process (bpf/events.c's enum kind).
type eventKind uint32

const (
	eventExec eventKind = 1 // it started running a program
	eventMmap eventKind = 2 // it mapped a file executable, at Addr
	eventExit eventKind = 3 // it exited
)

// event is bpf/events.c's struct event.
type event struct {
	PID  uint32
	Kind eventKind
	Addr uint64
}

// source is the kernel side of a watch: the events programs attached to
// the system call, exec and exit raw tracepoints, and their ring buffer.
type source struct {
	objs  eventsObjects
	links []link.Link
	rd    *ringbuf.Reader
}

// newSource loads and attaches the events program.
func newSource() (_ *source, err error) {
	s := &source{}
	if err := loadEventsObjects(&s.objs, nil); err != nil {
		return nil, fmt.Errorf("watch: loading the events program: %w", err)
	}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	for _, tp := range []struct {
		name string
		prog *ebpf.Program
	}{
		{"sys_enter", s.objs.SysEnter},
		{"sys_exit", s.objs.SysExit},
		{"sched_process_exec", s.objs.ProcessExec},
		{"sched_process_exit", s.objs.ProcessExit},
	} {
		l, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: tp.name, Program: tp.prog})
		if err != nil {
			return nil, fmt.Errorf("watch: attaching to the raw tracepoint %s: %w", tp.name, err)
		}
		s.links = append(s.links, l)
	}
	if s.rd, err = ringbuf.NewReader(s.objs.Events); err != nil {
		return nil, fmt.Errorf("watch: reading the events: %w", err)
	}
	return s, nil
}

// read returns the next event, waiting for one; after Close it fails with
// an error wrapping os.ErrClosed.
func (s *source) read() (event, error) {
	rec, err := s.rd.Read()
	if err != nil {
		if errors.Is(err, ringbuf.ErrClosed) {
			err = fmt.Errorf("%w: %w", os.ErrClosed, err)
		}
		return event{}, err
	}
	if len(rec.RawSample) < 16 {
		return event{}, fmt.Errorf("watch: an event of %d bytes", len(rec.RawSample))
	}
	b := rec.RawSample
	return event{
		PID:  binary.NativeEndian.Uint32(b),
		Kind: eventKind(binary.NativeEndian.Uint32(b[4:])),
		Addr: binary.NativeEndian.Uint64(b[8:]),
	}, nil
}

// lost returns how many events the ring buffer had no room for.
func (s *source) lost() uint64 {
	var n uint64
	_ = s.objs.Lost.Lookup(uint32(0), &n)
	return n
}

// Close detaches the events program and frees it; a read in progress
// returns.
func (s *source) Close() error {
	var errs []error
	if s.rd != nil {
		errs = append(errs, s.rd.Close())
	}
	for _, l := range s.links {
		errs = append(errs, l.Close())
	}
	errs = append(errs, s.objs.Close())
	return errors.Join(errs...)
}

// mapping is one line of /proc/PID/maps: a file mapped executable. Dev and
// Ino are the file the kernel maps, and probes: behind an overlay, the
// real (lower or upper) file, whose inode two containers of one image
// share.
type mapping struct {
	Start, End uint64
	Major      uint32
	Minor      uint32
	Ino        uint64
	Path       string // as the process sees it
	Offset     uint64 // in the file
}

// execMappings returns the file mappings of pid that are executable.
func execMappings(pid int) ([]mapping, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/maps")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mapping
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		m, ok := parseMapsLine(sc.Text())
		if ok {
			out = append(out, m)
		}
	}
	return out, sc.Err()
}

// parseMapsLine parses "START-END PERMS OFFSET MAJOR:MINOR INODE PATH" of
// an executable file mapping; ok is false for any other line.
func parseMapsLine(line string) (m mapping, ok bool) {
	f := strings.Fields(line)
	if len(f) < 6 || len(f[1]) < 3 || f[1][2] != 'x' || f[4] == "0" || !strings.HasPrefix(f[5], "/") {
		return mapping{}, false
	}
	start, end, ok1 := strings.Cut(f[0], "-")
	major, minor, ok2 := strings.Cut(f[3], ":")
	if !ok1 || !ok2 {
		return mapping{}, false
	}
	var err error
	parse := func(s string, base int, bits int) uint64 {
		v, e := strconv.ParseUint(s, base, bits)
		if e != nil {
			err = e
		}
		return v
	}
	m.Start, m.End = parse(start, 16, 64), parse(end, 16, 64)
	m.Offset = parse(f[2], 16, 64)
	m.Major, m.Minor = uint32(parse(major, 16, 32)), uint32(parse(minor, 16, 32))
	m.Ino = parse(f[4], 10, 64)
	if err != nil {
		return mapping{}, false
	}
	// A path may hold spaces, and a deleted file ends in " (deleted)".
	m.Path = strings.Join(f[5:], " ")
	return m, true
}
