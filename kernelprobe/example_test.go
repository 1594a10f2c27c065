package kernelprobe_test

import (
	"fmt"
	"log"

	"github.com/cilium/ebpf"
	"github.com/multiprobe/multiprobe/kernelprobe"
)

// Decide the attach path once, then prepare every program for it before
// loading. Needs root.
func ExampleDetect() {
	f, err := kernelprobe.Detect()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(f)

	spec, err := ebpf.LoadCollectionSpec("probes.o")
	if err != nil {
		log.Fatal(err)
	}
	kernelprobe.PrepareCollectionSpec(spec, f.Path())
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		log.Fatal(err)
	}
	defer coll.Close()
}

// MULTIPROBE_FORCE=fallback makes any kernel look like one without
// uprobe_multi links.
func ExampleParseForce() {
	force, err := kernelprobe.ParseForce("fallback,nocookie")
	if err != nil {
		log.Fatal(err)
	}
	f := kernelprobe.Features{Release: "6.18.0", UprobeMulti: true, UprobeMultiPIDFilter: true, Cookies: true}
	fmt.Println(f.Path())
	force(&f)
	fmt.Println(f.Path(), f.Cookies)

	_, err = kernelprobe.ParseForce("fallbak")
	fmt.Println(err)
	// Output:
	// uprobe_multi
	// perf_event false
	// kernelprobe: MULTIPROBE_FORCE="fallbak": unknown word "fallbak" (want a comma-separated list of fallback, nopidfilter, nocookie, norefctr, nosession): bad MULTIPROBE_FORCE value
}

// A test that must run the fallback path on any kernel.
func ExampleSetOverride() {
	restore := kernelprobe.SetOverride(func(f *kernelprobe.Features) { f.UprobeMulti = false })
	defer restore()

	f, _ := kernelprobe.Detect()
	fmt.Println(f.Path())
}
