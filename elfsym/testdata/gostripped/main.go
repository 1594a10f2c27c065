// Command gostripped is a Go program that elfsym's tests build with
// -ldflags=-s, which drops .symtab but keeps .gopclntab.
package main

import "fmt"

type counter struct{ n int }

//go:noinline
func (c *counter) Add(d int) { c.n += d }

//go:noinline
func hello(s string) string { return "hello " + s }

func main() {
	c := &counter{}
	c.Add(2)
	fmt.Println(hello("world"), c.n)
}
