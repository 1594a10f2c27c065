package testprogs_test

import (
	"fmt"

	"github.com/multiprobe/multiprobe/internal/testprogs"
)

// What `target 5` does to function 7 of a generated target.
func ExampleExpectedCalls() {
	calls := testprogs.ExpectedCalls(7, 5)
	last := testprogs.ExpectedReturn(7, uint64(calls-1))
	fmt.Println(testprogs.FuncName(7), "called", calls, "times, last returned", last)
	fmt.Println(testprogs.FuncName(10), "has alias", testprogs.HasAlias(10), testprogs.AliasName(10))
	// Output:
	// func_00007 called 6 times, last returned 17
	// func_00010 has alias true alias_00010
}
