// Package args traces the arguments and return values of probed sites,
// hit by hit, with a BPF program of its own: a USDT probe's arguments
// (read through its argument specs, bpf/mp_usdt.bpf.h), a function's
// first six integer arguments at its entry (in the C calling convention,
// or Go's for a Go program) and its return value at a uretprobe, and up to
// three of them read as C strings. Each hit is counted per site too, as
// package count counts.
//
//	plan, err := multiprobe.Resolve(probes, nil)
//	...
//	t, err := args.Attach(plan, &args.Options{Strings: []int{0}})
//	...
//	defer t.Close()
//	for {
//		h, err := t.Read()
//		if err != nil {
//			break // args.ErrClosed, or ErrFlushed after Flush
//		}
//		fmt.Println(h.Site.Name, h.Args, h.Strings[0])
//	}
//
// The hits travel through a ring buffer (4 MiB): a hit that finds it full
// is dropped and counted (Dropped), never waited for. Read blocks until a
// hit comes; Flush makes it return what is buffered, then ErrFlushed, so
// that a caller that detached the probes reads the last hits. NewForWatch
// and Fill trace the files a package watch attaches.
//
// The tracer reads registers, whose layout it knows on amd64, arm64,
// riscv64, s390x and ppc64le (only x86-64 and arm64 run in the tests).
package args
