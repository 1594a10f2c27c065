package watch

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"

	"github.com/multiprobe/multiprobe/internal/bpfsys"
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

// sourceObjects are the events programs and their maps.
type sourceObjects struct {
	SysEnter    *ebpf.Program `ebpf:"sys_enter"`
	SysExit     *ebpf.Program `ebpf:"sys_exit"`
	ProcessExec *ebpf.Program `ebpf:"process_exec"`
	ProcessExit *ebpf.Program `ebpf:"process_exit"`
	Events      *ebpf.Map     `ebpf:"events"`
	Lost        *ebpf.Map     `ebpf:"lost"`
}

// Close frees what was loaded (Close of a nil Program or Map does nothing).
func (o *sourceObjects) Close() error {
	return errors.Join(o.SysEnter.Close(), o.SysExit.Close(), o.ProcessExec.Close(), o.ProcessExit.Close(),
		o.Events.Close(), o.Lost.Close())
}

// source is the kernel side of a watch: the events programs attached to
// the system call, exec and exit raw tracepoints, and their ring buffer;
// and, where the kernel has iterators of one task's mappings (Linux 6.1),
// the program that lists a process's files as the kernel maps them.
type source struct {
	objs  sourceObjects
	links []link.Link
	rd    *ringbuf.Reader
	vmas  *ebpf.Program // nil before Linux 6.1
}

// newSource loads and attaches the events program.
func newSource() (_ *source, err error) {
	s := &source{}
	spec, err := loadEvents()
	if err != nil {
		return nil, fmt.Errorf("watch: the events program: %w", err)
	}
	if err := spec.LoadAndAssign(&s.objs, nil); err != nil {
		return nil, fmt.Errorf("watch: loading the events program: %w", err)
	}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	s.vmas = loadVMAs(spec)
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

// readMore returns the events read already by the kernel's side and not
// yet by this one, up to max, without waiting: after read, the rest of a
// burst, to be handled together.
func (s *source) readMore(events []event, max int) ([]event, error) {
	// A deadline passed already, not AvailableBytes, which reads the
	// ring without the reader's lock, racing with Close.
	s.rd.SetDeadline(time.Now())
	defer s.rd.SetDeadline(time.Time{})
	for len(events) < max {
		e, err := s.read()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			break
		}
		if err != nil {
			return events, err
		}
		events = append(events, e)
	}
	return events, nil
}

// lost returns how many events the ring buffer had no room for.
func (s *source) lost() uint64 {
	var n uint64
	_ = s.objs.Lost.Lookup(uint32(0), &n)
	return n
}

// stop ends reading: a read in progress returns, and reads after fail.
// The programs stay loaded (a reader of the events may still be using the
// iterator) until Close.
func (s *source) stop() error {
	if s.rd == nil {
		return nil
	}
	return s.rd.Close() // a second Close does nothing
}

// Close stops reading, detaches the events program and frees it.
func (s *source) Close() error {
	errs := []error{s.stop()}
	for _, l := range s.links {
		errs = append(errs, l.Close())
	}
	errs = append(errs, s.objs.Close())
	if s.vmas != nil {
		errs = append(errs, s.vmas.Close())
	}
	return errors.Join(errs...)
}

// loadVMAs loads the task_vma iterator and checks that the kernel runs it
// over one process (Linux 6.1; before, it would take the process as a map
// and walk every task), or returns nil.
func loadVMAs(spec *ebpf.CollectionSpec) *ebpf.Program {
	var objs struct {
		FileVMAs *ebpf.Program `ebpf:"file_vmas"`
	}
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		return nil // before Linux 5.13, or no kernel BTF
	}
	if _, err := fileVMAs(objs.FileVMAs, os.Getpid()); err != nil {
		objs.FileVMAs.Close()
		return nil
	}
	return objs.FileVMAs
}

// vmaRecord is bpf/events.c's struct vma.
type vmaRecord struct {
	Start, Ino uint64
	Dev, _     uint32
}

// fileVMAs runs the task_vma iterator prog over process pid: its
// executable file mappings by start address, each with the file the kernel
// maps (behind an overlay, the layer's file: where a uprobe is).
func fileVMAs(prog *ebpf.Program, pid int) (map[uint64]fileKey, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("watch: the mappings of process %d", pid) // 0 would be every task
	}
	fd, errno := bpfsys.LinkCreateIterTask(prog.FD(), uint32(pid))
	if errno != 0 {
		return nil, fmt.Errorf("watch: an iterator of process %d's mappings: %w", pid, errno)
	}
	l, err := link.NewFromFD(fd)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	it, ok := l.(*link.Iter)
	if !ok {
		return nil, fmt.Errorf("watch: link %T is not an iterator", l)
	}
	rd, err := it.Open()
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	data, err := io.ReadAll(rd)
	if err != nil {
		return nil, fmt.Errorf("watch: reading process %d's mappings: %w", pid, err)
	}
	out := map[uint64]fileKey{}
	for len(data) >= 24 {
		var r vmaRecord
		r.Start = binary.NativeEndian.Uint64(data)
		r.Ino = binary.NativeEndian.Uint64(data[8:])
		r.Dev = binary.NativeEndian.Uint32(data[16:])
		// The kernel's dev_t: major in the top 12 bits, minor below.
		out[r.Start] = fileKey{major: r.Dev >> 20, minor: r.Dev & (1<<20 - 1), ino: r.Ino}
		data = data[24:]
	}
	return out, nil
}
