package profile

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// ErrNoLineInfo is returned by NewSampler for a program the kernel has no
// BTF line info for: its samples could not be put on source lines. A
// Meter can still measure its runs if it has BTF function info.
var ErrNoLineInfo = errors.New("program has no BTF line info")

// ErrNotJITed is returned by NewSampler for a program that runs in the
// kernel's interpreter, whose instruction pointer is never in the program.
var ErrNotJITed = errors.New("program is not JIT-compiled")

// SampleOptions are the options of NewSampler.
type SampleOptions struct {
	// Frequency is how many times a second each CPU is sampled; 0 means
	// 999, off the beat of timers that fire at round rates.
	Frequency int
	// Copies are programs loaded from the same instructions as the one
	// sampled, such as the copies a multiprobe.Link attaches
	// (Link.Programs): their samples count as its.
	Copies []*ebpf.Program
}

// Sampler samples every CPU at a fixed frequency with the kernel's
// software cpu-clock event and keeps the samples whose kernel
// instruction pointer is in one program's JIT image, counted by the
// source line the JIT compiled that code from.
//
// The samples are read by the perf event ring buffers in this process,
// not by a BPF perf_event program: the kernel does not run a BPF program
// on a sample taken while another BPF program of a tracing kind (a
// kprobe, a uprobe) runs on that CPU (bpf_prog_active), which is exactly
// where the samples are wanted.
type Sampler struct {
	prog    string
	period  time.Duration
	started time.Time
	image   *jitImage
	rings   []*ring

	stop chan struct{}
	done chan struct{}

	mu      sync.Mutex
	stopped time.Time
	hits    map[hit]uint64 // samples in the program
	other   uint64         // kernel samples elsewhere
	lost    uint64         // samples the kernel dropped, the rings full
	symbols *kernelSymbols // read at the first Samples with callees
	closed  atomic.Bool
}

// A hit is where a sample found the program: the address of its code
// that ran, or that called the kernel function (a helper, a map's
// lookup) the sample was taken in, then callee, an address in that
// function; 0 when the program's own code ran.
type hit struct{ ip, callee uint64 }

// NewSampler starts sampling where prog runs on every CPU. prog stays the
// caller's. Close stops it and releases what it holds.
func NewSampler(prog *ebpf.Program, opts SampleOptions) (*Sampler, error) {
	freq := cmp.Or(opts.Frequency, 999)
	if freq < 1 || freq > 100_000 {
		return nil, fmt.Errorf("profile: sampling frequency %d Hz: want 1 to 100000", freq)
	}
	var infos []*ebpf.ProgramInfo
	for _, p := range append([]*ebpf.Program{prog}, opts.Copies...) {
		info, err := p.Info()
		if err != nil {
			return nil, fmt.Errorf("profile: program info: %w", err)
		}
		infos = append(infos, info)
	}
	image, err := newJITImage(infos)
	if err != nil {
		return nil, fmt.Errorf("profile: program %q: %w", infos[0].Name, err)
	}
	info := infos[0]
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, fmt.Errorf("profile: %w", err)
	}
	s := &Sampler{
		prog:   info.Name,
		period: time.Second / time.Duration(freq),
		image:  image,
		hits:   make(map[hit]uint64),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	for cpu := range cpus {
		r, err := openRing(cpu, freq)
		if errors.Is(err, unix.ENODEV) || errors.Is(err, unix.EINVAL) && !cpuOnline(cpu) {
			continue // a possible CPU that is offline
		}
		if err != nil {
			s.closeRings()
			return nil, fmt.Errorf("profile: sampling CPU %d: %w", cpu, err)
		}
		s.rings = append(s.rings, r)
	}
	for _, r := range s.rings {
		if err := r.enable(); err != nil {
			s.closeRings()
			return nil, fmt.Errorf("profile: enabling the sampler: %w", err)
		}
	}
	s.started = time.Now()
	go s.drain()
	return s, nil
}

// cpuOnline reports whether cpu is online, as far as sysfs says.
func cpuOnline(cpu int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/sys/devices/system/cpu/cpu%d/online", cpu))
	return err != nil || len(b) == 0 || b[0] != '0'
}

// drain empties the rings until Close, often enough that none fills: a
// ring holds some seconds of samples at any frequency NewSampler takes.
func (s *Sampler) drain() {
	defer close(s.done)
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			s.readRings()
			return
		case <-t.C:
			s.readRings()
		}
	}
}

func (s *Sampler) readRings() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.rings {
		r.read(func(ip uint64, chain []uint64) {
			if s.image.contains(ip) {
				s.hits[hit{ip: ip}]++
				return
			}
			// In the kernel: the program called it if a return address
			// into the program is on the stack. The frame above that is
			// the function it called, the one above ip.
			callee := ip
			for _, a := range chain {
				if a >= perfContextMax || a == ip {
					continue // a context marker, or ip again
				}
				// a is a return address: the call is before it.
				if s.image.contains(a - 1) {
					s.hits[hit{ip: a - 1, callee: callee}]++
					return
				}
				callee = a
			}
			s.other++
		}, func(n uint64) { s.lost += n })
	}
}

// Close stops sampling and releases the perf events. It returns nil if
// called again.
func (s *Sampler) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	for _, r := range s.rings {
		r.disable()
	}
	close(s.stop)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = time.Now()
	return s.closeRings()
}

func (s *Sampler) closeRings() error {
	var errs []error
	for _, r := range s.rings {
		errs = append(errs, r.close())
	}
	s.rings = nil
	return errors.Join(errs...)
}

// Samples returns what was sampled so far, and all of it after Close.
func (s *Sampler) Samples() *Samples {
	if !s.closed.Load() {
		s.readRings()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	end := s.stopped
	if end.IsZero() {
		end = time.Now()
	}
	out := &Samples{
		Program:  s.prog,
		Period:   s.period,
		Start:    s.started,
		Duration: end.Sub(s.started),
		Other:    s.other,
		Lost:     s.lost,
		start:    s.image.funcs[0].start,
		end:      s.image.funcs[len(s.image.funcs)-1].end,
	}
	// One source line can have several line records (a column each, or
	// code the compiler moved around): they count as one.
	type key struct {
		fn, file string
		line     int
	}
	byLine := make(map[key]int) // index in out.Lines
	calls := make(map[key]map[string]uint64)
	if s.symbols == nil {
		for h := range s.hits {
			if h.callee != 0 {
				s.symbols = readKernelSymbols()
				break
			}
		}
	}
	for h, n := range s.hits {
		var callee string
		if h.callee != 0 {
			callee = s.symbols.name(h.callee)
			// Called from the prologue, the fentry and fexit programs
			// attached to this one, a Meter's among them: their cost,
			// not the program's.
			if strings.HasPrefix(callee, "bpf_trampoline_") {
				out.Trampolines += n
				continue
			}
		}
		out.Total += n
		l := s.image.lineAt(h.ip)
		k := key{l.Func, l.File, l.Line.Line}
		i, ok := byLine[k]
		if !ok {
			i = len(out.Lines)
			byLine[k] = i
			l.Line.addr = l.start
			out.Lines = append(out.Lines, l.Line)
		}
		if l.Insn < out.Lines[i].Insn {
			out.Lines[i].Insn, out.Lines[i].addr = l.Insn, l.start
		}
		out.Lines[i].Samples += n
		if h.callee == 0 {
			out.Lines[i].Self += n
			continue
		}
		if calls[k] == nil {
			calls[k] = make(map[string]uint64)
		}
		calls[k][callee] += n
	}
	for k, m := range calls {
		l := &out.Lines[byLine[k]]
		for name, n := range m {
			l.Callees = append(l.Callees, Callee{Func: name, Samples: n})
		}
		slices.SortFunc(l.Callees, func(a, b Callee) int {
			return cmp.Or(cmp.Compare(b.Samples, a.Samples), strings.Compare(a.Func, b.Func))
		})
	}
	slices.SortFunc(out.Lines, func(a, b Line) int {
		return cmp.Or(cmp.Compare(b.Samples, a.Samples), cmp.Compare(a.Insn, b.Insn))
	})
	return out
}

// Samples is what a Sampler saw.
type Samples struct {
	Program  string        // the program's name
	Period   time.Duration // the time between two samples on a CPU
	Start    time.Time
	Duration time.Duration
	Total    uint64 // samples in the program
	// Trampolines are the samples in the BPF trampolines the program
	// calls, which run the fentry and fexit programs attached to it (a
	// Meter's too): not the program's own cost, and on no line.
	Trampolines uint64
	Other       uint64 // samples in the kernel elsewhere
	Lost        uint64 // samples the kernel dropped
	Lines       []Line // hottest first

	start, end uint64 // the JIT image
}

// Callee is a kernel function a line called (a helper, a map's lookup,
// a trampoline) and how many samples were taken in it, or in what it
// called in turn. It is the outermost kernel frame the stack shows below
// the program's: where a leaf function keeps its return address in a
// register (arm64), a sample in it shows the leaf, not its caller.
type Callee struct {
	Func    string // its name in /proc/kallsyms, or its address
	Samples uint64
}

// Line is one source line of a sampled program and how often it was
// found running.
type Line struct {
	Func   string // the BPF function (the program's or a subprogram's)
	File   string // "" where the program has no line info there
	Line   int
	Column int
	Source string // the line's text, as the compiler recorded it
	Insn   int    // the BPF instruction the line starts at
	// Samples are the samples on the line: Self in its own code, the
	// rest in the kernel functions it called, by Callees.
	Samples uint64
	Self    uint64
	Callees []Callee // most samples first

	addr uint64 // where its code starts in the JIT image
}

// String formats l as file:line, or as the function where it has no line.
func (l Line) String() string {
	if l.File == "" {
		return l.Func
	}
	return fmt.Sprintf("%s:%d", l.File, l.Line)
}

// jitImage maps instruction pointers in a program's JIT image to the
// functions and source lines they were compiled from.
type jitImage struct {
	funcs []jitFunc // by start
	lines []jitLine // by start
}

type jitFunc struct {
	start, end uint64
	name       string
}

type jitLine struct {
	start uint64
	Line
}

// newJITImage maps the JIT images of a program and of its copies, programs
// loaded from the same instructions: each copy has its own image and
// addresses, and mostly the same lines. Reading a program's lines loads
// its BTF, so a copy takes the lines read before when it has as many (the
// thousands of a multiprobe.Link's copies); the kernel's rewrites can add
// one (a constant where the original reads a BPF cookie).
func newJITImage(infos []*ebpf.ProgramInfo) (*jitImage, error) {
	funcInfos, _ := infos[0].FuncInfos()
	tables := map[int][]jitLine{} // by length
	linesOf := func(info *ebpf.ProgramInfo, n int) ([]jitLine, error) {
		if lines, ok := tables[n]; ok {
			return lines, nil
		}
		lineInfos, err := info.LineInfos()
		if err != nil {
			return nil, fmt.Errorf("%w (load it from an object compiled with -g): %w", ErrNoLineInfo, err)
		}
		lines := make([]jitLine, len(lineInfos))
		for i, lo := range lineInfos {
			lines[i].Insn = int(lo.Offset)
			if lo.Line != nil {
				lines[i].File, lines[i].Line.Line, lines[i].Column, lines[i].Source = lo.Line.FileName(), int(lo.Line.LineNumber()), int(lo.Line.LineColumn()), lo.Line.Line()
			}
		}
		tables[len(lines)] = lines
		return lines, nil
	}

	im := &jitImage{}
	for _, info := range infos {
		ksyms, _ := info.JitedKsymAddrs()
		lens, _ := info.JitedFuncLens()
		size, err := info.JitedSize()
		if err == nil && size == 0 || len(ksyms) == 0 {
			return nil, fmt.Errorf("%w (or this process may not read its addresses: it takes root, and kernel.kptr_restrict below 2)", ErrNotJITed)
		}
		if len(lens) != len(ksyms) {
			// One function: older kernels report no lengths for it.
			if err != nil || len(ksyms) != 1 {
				return nil, fmt.Errorf("%w: %d JIT functions, %d lengths", ErrNotJITed, len(ksyms), len(lens))
			}
			lens = []uint32{size}
		}
		if ksyms[0] == 0 {
			return nil, fmt.Errorf("%w: its JIT addresses read as 0: sample as root, with kernel.kptr_restrict below 2", ErrNotJITed)
		}
		jited, _ := info.JitedLineInfos()
		lines, err := linesOf(info, len(jited))
		if err != nil {
			return nil, err
		}
		if len(jited) != len(lines) {
			return nil, fmt.Errorf("%w: %d lines, %d of them placed in the JIT image", ErrNoLineInfo, len(lines), len(jited))
		}
		funcs := make([]jitFunc, len(ksyms))
		for i, a := range ksyms {
			funcs[i] = jitFunc{start: uint64(a), end: uint64(a) + uint64(lens[i]), name: info.Name}
			if i < len(funcInfos) && funcInfos[i].Func != nil {
				funcs[i].name = funcInfos[i].Func.Name
			} else if i > 0 {
				funcs[i].name = fmt.Sprintf("%s.sub%d", info.Name, i)
			}
		}
		im.funcs = append(im.funcs, funcs...)
		for i, l := range lines {
			l.start = jited[i]
			for _, f := range funcs {
				if f.start <= l.start && l.start < f.end {
					l.Func = f.name
				}
			}
			im.lines = append(im.lines, l)
		}
	}
	sort.Slice(im.funcs, func(i, j int) bool { return im.funcs[i].start < im.funcs[j].start })
	sort.SliceStable(im.lines, func(i, j int) bool { return im.lines[i].start < im.lines[j].start })
	return im, nil
}

func (im *jitImage) funcAt(ip uint64) *jitFunc {
	i := sort.Search(len(im.funcs), func(i int) bool { return im.funcs[i].start > ip }) - 1
	if i < 0 || ip >= im.funcs[i].end {
		return nil
	}
	return &im.funcs[i]
}

func (im *jitImage) contains(ip uint64) bool { return im.funcAt(ip) != nil }

// lineAt returns the line whose code ip is in: the last line that starts
// at or before ip within ip's function. Code before a function's first
// line (the JIT's prologue) is put on the function, with no line.
func (im *jitImage) lineAt(ip uint64) jitLine {
	f := im.funcAt(ip)
	i := sort.Search(len(im.lines), func(i int) bool { return im.lines[i].start > ip }) - 1
	if i >= 0 && im.lines[i].start >= f.start {
		return im.lines[i]
	}
	return jitLine{start: f.start, Line: Line{Func: f.name}}
}

// perfContextMax is the lowest of the markers a call chain holds between
// its frames (PERF_CONTEXT_KERNEL and such), which are no addresses.
const perfContextMax uint64 = 1<<64 - 4095 // (__u64)PERF_CONTEXT_MAX, -4095
