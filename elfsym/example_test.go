package elfsym_test

import (
	"errors"
	"fmt"
	"log"
	"os"
	"strings"

	"github.com/multiprobe/multiprobe/elfsym"
)

// Resolve a library by its bare name, as the dynamic loader would find it,
// and glob over its functions.
func ExampleResolve() {
	sites, err := elfsym.Resolve("libc.so.6", "malloc", "pthread_create")
	if err != nil {
		log.Fatal(err)
	}
	for _, s := range sites {
		fmt.Println(s.Name, s.Offset > 0)
	}
	// Unordered output:
	// malloc true
	// pthread_create true
}

// Open a file once to resolve several sets of patterns, excluding some
// names from a glob.
func ExampleFile_Resolve() {
	path, err := elfsym.LookPath("libc.so.6")
	if err != nil {
		log.Fatal(err)
	}
	f, err := elfsym.Open(path)
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()

	sites, err := f.Resolve("pthread_mutex_*lock", "!*trylock", "!*timedlock")
	if err != nil {
		log.Fatal(err)
	}
	for _, s := range sites {
		fmt.Println(s.Name)
	}

	_, err = f.Resolve("no_such_function")
	fmt.Println(errors.Is(err, elfsym.ErrNoMatch))
	// Unordered output:
	// pthread_mutex_lock
	// pthread_mutex_clocklock
	// pthread_mutex_unlock
	// true
}

// Select the sites first, hand their offsets to whatever needs them at
// once (here: count them), and build the named Sites on another goroutine
// meanwhile.
func ExampleFile_Select() {
	path, err := elfsym.LookPath("libc.so.6")
	if err != nil {
		log.Fatal(err)
	}
	f, err := elfsym.Open(path)
	if err != nil {
		log.Fatal(err)
	}
	sel, err := f.Select("pthread_mutex_*lock", "!*trylock", "!*timedlock")
	f.Close() // a Selection does not need its File
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan []elfsym.Site)
	go func() { done <- sel.Sites() }()

	offsets := sel.Offsets()
	fmt.Println(len(offsets), "offsets")
	for i, s := range <-done {
		fmt.Println(s.Name, s.Offset == offsets[i])
	}
	// Unordered output:
	// 3 offsets
	// pthread_mutex_lock true
	// pthread_mutex_clocklock true
	// pthread_mutex_unlock true
}

// Open the binary once and read it through that descriptor, so that the
// symbols resolved are those of the file later handed to the kernel (as
// /proc/self/fd/N), even if the path is replaced in between. Errors still
// name the path.
func ExampleOpenFile() {
	path, err := elfsym.LookPath("libc.so.6")
	if err != nil {
		log.Fatal(err)
	}
	fd, err := os.Open(path)
	if err != nil {
		log.Fatal(err)
	}
	defer fd.Close()
	f, err := elfsym.OpenFile(fd)
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()

	sites, err := f.Resolve("malloc")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(sites[0].Name)
	_, err = f.Resolve("no_such_function")
	fmt.Println(strings.HasPrefix(err.Error(), path+": "))
	// Output:
	// malloc
	// true
}
