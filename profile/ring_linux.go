package profile

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ring is one CPU's sampling event and the ring buffer it writes to.
type ring struct {
	fd   int
	mem  []byte
	meta *unix.PerfEventMmapPage
	data []byte
}

// maxStack is how many frames of a sample's kernel stack are recorded:
// enough to reach the program from inside the deepest helper, so a
// record has at most recordMax bytes.
const (
	maxStack  = 32
	recordMax = 8 + 8 + 8 + 8*(maxStack+2) // header, ip, nr, frames and context markers
)

// ringPages is the size of a ring's data area in pages: 64 pages hold
// 900 samples of the largest size, and thousands of a usual one (a dozen
// frames), a second at the highest frequency a kernel takes by default
// (kernel.perf_event_max_sample_rate), while drain reads every 50 ms.
const ringPages = 64

func openRing(cpu, freq int) (*ring, error) {
	attr := unix.PerfEventAttr{
		Type:        unix.PERF_TYPE_SOFTWARE,
		Config:      unix.PERF_COUNT_SW_CPU_CLOCK,
		Sample:      uint64(freq),
		Sample_type: unix.PERF_SAMPLE_IP | unix.PERF_SAMPLE_CALLCHAIN,
		// Only the kernel's samples and stacks: a BPF program runs there.
		Bits:             unix.PerfBitDisabled | unix.PerfBitFreq | unix.PerfBitExcludeUser | unix.PerfBitExcludeHv | unix.PerfBitExcludeCallchainUser,
		Sample_max_stack: maxStack,
	}
	attr.Size = uint32(unsafe.Sizeof(attr))
	fd, err := unix.PerfEventOpen(&attr, -1, cpu, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	page := unix.Getpagesize()
	mem, err := unix.Mmap(fd, 0, (1+ringPages)*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("mapping its ring buffer: %w", err)
	}
	r := &ring{fd: fd, mem: mem, meta: (*unix.PerfEventMmapPage)(unsafe.Pointer(&mem[0]))}
	off, size := r.meta.Data_offset, r.meta.Data_size
	if size == 0 { // before Linux 4.1
		off, size = uint64(page), uint64(ringPages*page)
	}
	r.data = mem[off : off+size]
	return r, nil
}

// read hands each sample's instruction pointer and kernel call chain to
// sample and each count of lost samples to lost, and frees what it read.
func (r *ring) read(sample func(ip uint64, chain []uint64), lost func(n uint64)) {
	head := atomic.LoadUint64(&r.meta.Data_head)
	tail := r.meta.Data_tail
	size := uint64(len(r.data))
	var rec [recordMax]byte
	var chain []uint64
	for tail < head {
		// A record may wrap around the end of the ring; copy it out.
		at := tail % size
		hdr := r.bytes(rec[:8], at)
		typ, n := binary.NativeEndian.Uint32(hdr[0:]), uint64(binary.NativeEndian.Uint16(hdr[6:]))
		if n < 8 || tail+n > head {
			break // malformed; drop the rest
		}
		if n <= uint64(len(rec)) {
			body := r.bytes(rec[:n], at)
			switch {
			case typ == unix.PERF_RECORD_SAMPLE && n >= 24:
				// ip, then the call chain: nr, then nr addresses.
				nr := binary.NativeEndian.Uint64(body[16:])
				if nr > (n-24)/8 {
					break
				}
				chain = chain[:0]
				for i := range nr {
					chain = append(chain, binary.NativeEndian.Uint64(body[24+8*i:]))
				}
				sample(binary.NativeEndian.Uint64(body[8:]), chain)
			case typ == unix.PERF_RECORD_LOST && n >= 24:
				lost(binary.NativeEndian.Uint64(body[16:]))
			}
		}
		tail += n
	}
	atomic.StoreUint64(&r.meta.Data_tail, head)
}

// bytes copies len(dst) bytes of the ring from at, wrapping around.
func (r *ring) bytes(dst []byte, at uint64) []byte {
	n := copy(dst, r.data[at:])
	copy(dst[n:], r.data)
	return dst
}

func (r *ring) close() error {
	return errors.Join(unix.Munmap(r.mem), unix.Close(r.fd))
}

func (r *ring) enable() error { return unix.IoctlSetInt(r.fd, unix.PERF_EVENT_IOC_ENABLE, 0) }

func (r *ring) disable() error { return unix.IoctlSetInt(r.fd, unix.PERF_EVENT_IOC_DISABLE, 0) }
