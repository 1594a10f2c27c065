package watch

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"

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
