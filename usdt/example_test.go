package usdt_test

import (
	"fmt"
	"log"

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

// Give each distinct argument spec an id, and pack it with the user's
// cookie into the BPF cookie of each site.
func ExampleSpecTable() {
	table := usdt.NewSpecTable(usdt.DefaultMaxSpecs, nil) // nil: no BPF map to write to
	args, _ := usdt.ParseArgs(usdt.ArchX86_64, "8@%rdi -4@%esi")
	spec, _ := usdt.NewSpec(args)
	id, _ := table.Acquire(spec)
	again, _ := table.Acquire(spec)
	cookie := usdt.PackCookie(id, 42)
	fmt.Printf("ids %d %d, cookie %#x\n", id, again, cookie)
	fmt.Println(table.Release(id), table.Release(again))
	// Output:
	// ids 1 1, cookie 0x10000002a
	// false true
}
