package main

import (
	"os"
	"strings"
	"testing"

	"github.com/multiprobe/multiprobe/internal/testutil"
)

// TestReadmeCommands checks that every CLI command the README shows is in
// the transcript that TestScripts runs, word for word, so that the two
// cannot part.
func TestReadmeCommands(t *testing.T) {
	if testutil.InGuest() {
		t.Skip("the README is the host's; a test VM has only the test binaries")
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	script, err := os.ReadFile("testdata/script/root/readme.txtar")
	if err != nil {
		t.Fatal(err)
	}
	const prefix = "go run ./cmd/multiprobe "
	n := 0
	for line := range strings.Lines(string(readme)) {
		cmd, ok := strings.CutPrefix(strings.TrimSpace(line), prefix)
		if !ok {
			continue
		}
		n++
		// As written, run in the foreground, or in the background while
		// the script gives it something to count.
		if !strings.Contains(string(script), "\nexec multiprobe "+cmd+"\n") && !strings.Contains(string(script), "\nexec multiprobe "+cmd+" &") {
			t.Errorf("README's command %q is not in testdata/script/root/readme.txtar as\nexec multiprobe %s", strings.TrimSpace(line), cmd)
		}
	}
	if n == 0 {
		t.Errorf("found no %q line in the README", prefix)
	}
}
