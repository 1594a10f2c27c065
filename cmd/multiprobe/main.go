package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
)

// A command is one subcommand of the CLI. Each lives in its own file and
// registers itself in commands from an init function.
type command struct {
	usage string // one line: arguments after the subcommand's name
	short string // what it does
	run   func(args []string, stdout, stderr io.Writer) error
}

var commands = map[string]*command{}

// usageError is returned by a subcommand for bad arguments: the CLI prints
// its message on one line and exits 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// exitStatus is returned by a subcommand that did its work but must exit
// with a status other than 0, such as 130 after SIGINT; it prints nothing.
type exitStatus struct{ code int }

func (e *exitStatus) Error() string { return fmt.Sprintf("exit status %d", e.code) }

func usagef(format string, args ...any) error {
	return &usageError{fmt.Sprintf(format, args...)}
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		printUsage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "multiprobe: unknown command %q (try: multiprobe help)\n", args[0])
		return 2
	}
	err := cmd.run(args[1:], stdout, stderr)
	var ue *usageError
	var es *exitStatus
	switch {
	case err == nil:
		return 0
	case errors.As(err, &es):
		return es.code
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "multiprobe %s: %s (usage: multiprobe %s %s)\n", args[0], ue.msg, args[0], cmd.usage)
		return 2
	default:
		fmt.Fprintf(stderr, "multiprobe %s: %v\n", args[0], err)
		return 1
	}
}

func printUsage(w io.Writer) {
	fmt.Fprintln(w, "usage: multiprobe COMMAND [ARGS]")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-6s %s\n         %s\n", n, commands[n].usage, commands[n].short)
	}
}

// newFlagSet returns a flag set for a subcommand whose errors come back as
// usage errors instead of printing the full flag list and exiting.
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// parseFlags parses args with fs and turns a flag error into a usage error.
// Flags may appear before or between positional arguments; everything after
// "--" is returned untouched in rest.
func parseFlags(fs *flag.FlagSet, args []string) (positional, rest []string, err error) {
	for i, a := range args {
		if a == "--" {
			args, rest = args[:i], args[i+1:]
			break
		}
	}
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, nil, err
			}
			return nil, nil, usagef("%v", err)
		}
		args = fs.Args()
		if len(args) == 0 {
			return positional, rest, nil
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
}
