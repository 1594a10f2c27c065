package fds

import (
	"os"
	"testing"
)

func TestCount(t *testing.T) {
	before, err := Count()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	during, err := Count()
	f.Close()
	after, err2 := Count()
	if err != nil || err2 != nil {
		t.Fatal(err, err2)
	}
	if during != before+1 || after != before {
		t.Errorf("counts %d, %d with one more open, %d after closing it", before, during, after)
	}
}
