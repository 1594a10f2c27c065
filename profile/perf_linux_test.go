package profile

import (
	"encoding/binary"
	"fmt"
	"slices"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestPerfContextMax(t *testing.T) {
	if want := uint64(1<<64 + unix.PERF_CONTEXT_MAX); perfContextMax != want {
		t.Fatalf("perfContextMax = %#x, want %#x", uint64(perfContextMax), want)
	}
}

// TestRingRead feeds a ring records as the kernel writes them, one
// wrapping around the end of the ring, and a lost-samples record.
func TestRingRead(t *testing.T) {
	const size = 256
	mem := make([]byte, 4096+size)
	r := &ring{mem: mem, meta: (*unix.PerfEventMmapPage)(unsafe.Pointer(&mem[0])), data: mem[4096:]}
	put := func(at uint64, b []byte) {
		for i, c := range b {
			r.data[(at+uint64(i))%size] = c
		}
	}
	record := func(typ uint32, words ...uint64) []byte {
		b := binary.NativeEndian.AppendUint32(nil, typ)
		b = binary.NativeEndian.AppendUint16(b, 0)
		b = binary.NativeEndian.AppendUint16(b, uint16(8+8*len(words)))
		for _, w := range words {
			b = binary.NativeEndian.AppendUint64(b, w)
		}
		return b
	}
	// Start near the end so that the third record wraps.
	tail := uint64(3*size + 200)
	r.meta.Data_tail = tail
	kernel := perfContextMax + 0xf7f // PERF_CONTEXT_KERNEL
	var recs []byte
	recs = append(recs, record(unix.PERF_RECORD_SAMPLE, 0xffffffffc0001000, 2, kernel, 0xffffffffc0001000)...)
	recs = append(recs, record(unix.PERF_RECORD_SAMPLE, 0xffffffff81000010, 3, kernel, 0xffffffff81000010, 0xffffffffc0001008)...)
	recs = append(recs, record(unix.PERF_RECORD_LOST, 7, 5)...)
	recs = append(recs, record(unix.PERF_RECORD_SAMPLE, 0xffffffffc0002000, 9, 1)...) // nr past the record: dropped
	recs = append(recs, record(unix.PERF_RECORD_SAMPLE, 0xffffffffc0002000, 0)...)
	put(tail, recs)
	r.meta.Data_head = tail + uint64(len(recs))

	var got []string
	var lost uint64
	r.read(func(ip uint64, chain []uint64) { got = append(got, fmt.Sprintf("%#x %#x", ip, chain)) }, func(n uint64) { lost += n })
	want := []string{
		fmt.Sprintf("0xffffffffc0001000 [%#x 0xffffffffc0001000]", kernel),
		fmt.Sprintf("0xffffffff81000010 [%#x 0xffffffff81000010 0xffffffffc0001008]", kernel),
		"0xffffffffc0002000 []",
	}
	if !slices.Equal(got, want) || lost != 5 {
		t.Errorf("read %q and %d lost, want %q and 5", got, lost, want)
	}
	if r.meta.Data_tail != r.meta.Data_head {
		t.Errorf("tail %d, want the head %d", r.meta.Data_tail, r.meta.Data_head)
	}
}
