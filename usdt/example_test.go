package usdt_test

import (
	"fmt"
	"log"

	"github.com/cilium/ebpf"

	"github.com/multiprobe/multiprobe/usdt"
)

// List the function-entry probes of a Python interpreter with their
// sites and decoded arguments.
func ExampleOpen() {
	f, err := usdt.Open("/usr/bin/python3")
	if err != nil {
		log.Fatal(err)
	}
	probes, err := f.Probes("python:function__*")
	if err != nil {
		log.Fatal(err)
	}
	for _, p := range probes {
		for _, s := range p.Sites {
			fmt.Printf("%s at file offset %#x semaphore %#x: %v\n", &p, s.Offset, s.SemaphoreOffset, s.Args)
		}
	}
}

func ExampleParseArgs() {
	args, err := usdt.ParseArgs(usdt.ArchX86_64, "-4@-20(%rbp) 8@%rdi 2@$7 -8@8(%rax,%rbx,8)")
	if err != nil {
		log.Fatal(err)
	}
	for _, a := range args {
		fmt.Println(a)
	}
	args, err = usdt.ParseArgs(usdt.ArchARM64, "8@x0 -4@[sp, 16]")
	if err != nil {
		log.Fatal(err)
	}
	for _, a := range args {
		fmt.Println(a)
	}
	// Output:
	// s32 *(rbp-20)
	// u64 rdi
	// u16 7
	// s64 *(rax+rbx*8+0x8)
	// u64 x0
	// s32 *(sp+0x10)
}

// Give each distinct argument spec an id in a loaded program's spec map,
// and pack it with the user's cookie into the BPF cookie of each site.
// Package multiprobe does this for every USDT site it attaches.
func ExampleAcquireSpecs() {
	var specMap *ebpf.Map // the loaded program's map named usdt.SpecMapName
	args, _ := usdt.ParseArgs(usdt.ArchX86_64, "8@%rdi -4@%esi")
	spec, _ := usdt.NewSpec(args)
	ids, err := usdt.AcquireSpecs(specMap, []usdt.Spec{spec, spec})
	if err != nil {
		log.Fatal(err)
	}
	defer ids.Release()
	for i, id := range ids.IDs() {
		fmt.Printf("site %d: cookie %#x\n", i, usdt.PackCookie(id, uint32(i)))
	}
}

// The upper half of a USDT site's cookie is its spec id, the lower half
// the user's own cookie.
func ExamplePackCookie() {
	cookie := usdt.PackCookie(1, 42)
	id, user := usdt.UnpackCookie(cookie)
	fmt.Printf("%#x: spec %d, user %d\n", cookie, id, user)
	// Output:
	// 0x10000002a: spec 1, user 42
}
