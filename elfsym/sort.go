package elfsym

import (
	"cmp"
	"math/bits"
	"slices"
)

// The sort: the hits by file offset, as packed integer keys.

// sort orders the hits by offset into r.keys and lists the offsets. Each
// part of the scan sorts its own hits, on its own CPU, and the sorted runs
// are merged: for 100,000 hits that halves the time on two CPUs.
func (r *resolver) sort() {
	maxOff := uint64(0)
	if r.collected {
		for i := range r.n {
			maxOff = max(maxOff, r.hit(i).offset)
		}
	} else {
		for w := range r.parts {
			for _, fd := range r.parts[w].found {
				maxOff = max(maxOff, fd.offset)
			}
		}
	}
	// r.packed is decided once, here; hits added later (aliases) are at
	// offsets already seen, so they fit when those did.
	r.packed, r.maxOff = !r.tune.noPack && r.n < 1<<keyBits && maxOff < 1<<(64-keyBits), maxOff
	if !r.packed {
		r.collect() // the keys are hit indexes: sorting reads the hits
	}
	runs := make([][]uint64, len(r.parts))
	if !r.collected {
		r.each(func(p *scanPart) {
			runs[p.index] = r.sortedKeys(p.hit, p.hit+len(p.found), p.found)
		})
	} else {
		runs = [][]uint64{r.sortedKeys(0, r.n, nil)}
	}
	r.keys = runs[0]
	for _, run := range runs[1:] {
		r.keys = mergeKeys(r.keys, run, r)
	}
	r.offsets = make([]uint64, 0, len(r.keys))
	for _, k := range r.keys {
		if off := r.keyOffset(k); len(r.offsets) == 0 || r.offsets[len(r.offsets)-1] != off {
			r.offsets = append(r.offsets, off)
		}
	}
}

// A key orders a hit: its offset above its index, so that sorting plain
// integers sorts hits by offset, ties in hit order. That is several times
// faster than sorting the 40-byte hits for the 100,000 of a big binary. A
// hit index needs keyBits bits; a file offset must leave them free.
const keyBits = 24

// keyOffset returns the offset of the hit that k orders.
func (r *resolver) keyOffset(k uint64) uint64 {
	if r.packed {
		return k >> keyBits
	}
	return r.hit(int(k)).offset
}

func (r *resolver) index(k uint64) int {
	if r.packed {
		return int(k & (1<<keyBits - 1))
	}
	return int(k)
}

// sortedKeys returns the keys of hits [lo, hi) sorted by offset. Before
// collect, found are those hits as scan found them.
func (r *resolver) sortedKeys(lo, hi int, found []found) []uint64 {
	keys := make([]uint64, 0, hi-lo)
	if !r.packed {
		// More than 16 million symbols, or offsets past 1 TiB: no real
		// file, but a sort by comparison still gives the right order.
		for i := lo; i < hi; i++ {
			keys = append(keys, uint64(i))
		}
		slices.SortStableFunc(keys, func(a, b uint64) int {
			return cmp.Compare(r.hit(int(a)).offset, r.hit(int(b)).offset)
		})
		return keys
	}
	sorted := true
	for i := lo; i < hi; i++ {
		var off uint64
		if found != nil {
			off = found[i-lo].offset
		} else {
			off = r.hit(i).offset
		}
		k := off<<keyBits | uint64(i)
		sorted = sorted && (len(keys) == 0 || keys[len(keys)-1] < k)
		keys = append(keys, k)
	}
	if !sorted {
		radixSort(keys, bits.Len64(r.maxOff))
	}
	return keys
}

// radixSort sorts keys by their offset bits, keyBits up to keyBits+offBits,
// keeping the order of equal offsets. The keys are distinct and in index
// order, so that is the order of the whole key; an LSD radix sort touches
// each key a few times instead of the log2(n) times of a comparison sort.
func radixSort(keys []uint64, offBits int) {
	if len(keys) < 256 {
		slices.Sort(keys)
		return
	}
	// Digits of up to 12 bits keep the counts in 32 KiB, within a core's
	// L1 or L2 cache; a binary under 16 MiB takes two passes.
	const maxDigit = 12
	passes := max(1, (offBits+maxDigit-1)/maxDigit)
	digit := (offBits + passes - 1) / passes
	mask := uint64(1)<<digit - 1
	count := make([]int, 1<<maxDigit+1)
	tmp := make([]uint64, len(keys))
	src, dst := keys, tmp
	for shift := keyBits; shift < keyBits+offBits; shift += digit {
		clear(count)
		for _, k := range src {
			count[(k>>shift)&mask+1]++
		}
		for i := 1; i < len(count); i++ {
			count[i] += count[i-1]
		}
		for _, k := range src {
			d := (k >> shift) & mask
			dst[count[d]] = k
			count[d]++
		}
		src, dst = dst, src
	}
	if &src[0] != &keys[0] {
		copy(keys, src)
	}
}
