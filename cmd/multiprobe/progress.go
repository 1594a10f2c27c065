package main

import (
	"fmt"
	"io"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/multiprobe/multiprobe"
)

// isTerminal reports whether w is a terminal: progress is for a person
// watching, not for a pipe or a file.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), ioctlReadTermios)
	return err == nil
}

// terminalProgress returns an Options.Progress that keeps one line on w
// up to date ("attaching 340/1000 sites of /bin/bash"), or nil when w is
// not a terminal.
func terminalProgress(w io.Writer) func(multiprobe.Progress) {
	if !isTerminal(w) {
		return nil
	}
	var mu sync.Mutex
	return func(p multiprobe.Progress) {
		mu.Lock()
		defer mu.Unlock()
		writeProgress(w, p)
	}
}

// writeProgress writes one report: over the line before it, and ending the
// line once the phase is done.
func writeProgress(w io.Writer, p multiprobe.Progress) {
	verb := map[string]string{"attach": "attaching", "detach": "detaching"}[p.Phase]
	if verb == "" {
		verb = p.Phase
	}
	of := ""
	if p.Path != "" {
		of = " of " + p.Path
	}
	end := ""
	if p.Done == p.Total {
		end = "\n"
	}
	// \r returns to the line's start, \x1b[K clears what a longer line
	// before left.
	fmt.Fprintf(w, "\r%s %d/%d sites%s (one perf-event uprobe each)\x1b[K%s", verb, p.Done, p.Total, of, end)
}
