// Command stackgrow is the Go target of multiprobe's tests. Its command line
// is
//
//	stackgrow [-wait] GOROUTINES DEPTH N
//
// Each of GOROUTINES goroutines calls Deep(DEPTH) once, which recurses
// DEPTH deep: GOROUTINES*(DEPTH+1) calls of Deep, on stacks that start
// small and grow several times on the way down, which makes
// runtime.morestack run Deep's first instructions again. Then Big, whose
// frame is large, Leaf, which has no stack check, and Pair, which returns
// two results from two return instructions, are each called N times, and
// Panicky, which panics (recovered) on every tenth call.
// With -wait it prints "ready" and waits for a line (or EOF) on stdin
// first; at the end it prints "done SUM".
package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"sync"
)

// Deep has a frame of over 256 bytes: 2,000 deep is half a megabyte of
// stack.
//
//go:noinline
func Deep(n int) int {
	var buf [256]byte
	buf[n%256] = byte(n)
	if n == 0 {
		return int(buf[0])
	}
	return Deep(n-1) + int(buf[n%256]&1)
}

// Big's frame is larger than the stack guard, which makes its check the
// longer form that computes SP-framesize first.
//
//go:noinline
func Big(n int) int {
	var buf [8192]byte
	buf[n%8192] = byte(n)
	return int(buf[(n+1)%8192]) + n
}

// Leaf runs without a stack check.
//
//go:nosplit
//go:noinline
func Leaf(n int) int { return n*2 + 1 }

// Panicky panics for every tenth n; Catch recovers. A probed function a
// panic unwinds through must leave the program running.
//
//go:noinline
func Panicky(n int) int {
	var buf [128]byte
	buf[n%128] = byte(n)
	if n%10 == 0 {
		panic(n)
	}
	return int(buf[n%128])
}

//go:noinline
func Catch(n int) (v int) {
	defer func() {
		if r := recover(); r != nil {
			v = -1
		}
	}()
	return Panicky(n)
}

// Pair returns from two places.
//
//go:noinline
func Pair(n int) (int, int) {
	if n%2 == 0 {
		return n, 1
	}
	return -n, 2
}

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "-wait" {
		fmt.Println("ready")
		bufio.NewReader(os.Stdin).ReadString('\n')
		args = args[1:]
	}
	if len(args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: stackgrow [-wait] GOROUTINES DEPTH N")
		os.Exit(2)
	}
	var v [3]int
	for i, a := range args {
		n, err := strconv.Atoi(a)
		if err != nil || n < 0 {
			fmt.Fprintf(os.Stderr, "stackgrow: bad number %q\n", a)
			os.Exit(2)
		}
		v[i] = n
	}
	var wg sync.WaitGroup
	sums := make([]int, v[0])
	for g := range v[0] {
		wg.Go(func() { sums[g] = Deep(v[1]) })
	}
	wg.Wait()
	sum := 0
	for _, s := range sums {
		sum += s
	}
	for i := range v[2] {
		a, b := Pair(i)
		sum += Big(i) + Leaf(i) + a + b + Catch(i)
	}
	fmt.Println("done", sum)
}
