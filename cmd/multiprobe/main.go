package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"runtime/debug"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// A command is one subcommand of the CLI. Each lives in its own file and
// registers itself in commands from an init function.
type command struct {
	usage string // one line: arguments after the subcommand's name
	short string // what it does, in one line
	long  string // more, for its help: a paragraph or two
	// examples are command lines, each with what it does after "  # ".
	examples []string
	run      func(args []string, stdout, stderr io.Writer) error
	// fs is the flag set run made, for the help: newFlagSet sets it.
	fs *flag.FlagSet
	// privileges are what the command needs from the kernel, as a user
	// would grant them ("CAP_BPF and CAP_PERFMON"); "" for none. A
	// command that fails with EPERM says so in one line.
	privileges string
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
	if os.Getenv(calibrateEnv) != "" {
		runCalibration()
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		printUsage(stderr)
		return 2
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		if len(args) == 1 {
			printUsage(stdout)
			return 0
		}
		// "help COMMAND" is "COMMAND --help".
		args = []string{args[1], "--help"}
	}
	if args[0] == "--version" || args[0] == "-version" || args[0] == "version" {
		fmt.Fprintln(stdout, version())
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
		printHelp(stdout, args[0], cmd)
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "multiprobe %s: %s (see: multiprobe help %s)\n", args[0], ue.msg, args[0])
		return 2
	case cmd.privileges != "" && errors.Is(err, unix.EPERM):
		// The chain under an EPERM (which feature probe, which map) does
		// not help: the user lacks a capability, and needs to hear which.
		fmt.Fprintf(stderr, "multiprobe %s: not permitted: it needs root, or %s (run it with sudo)\n", args[0], cmd.privileges)
		return 1
	default:
		fmt.Fprintf(stderr, "multiprobe %s: %v\n", args[0], err)
		return 1
	}
}

// version is what --version prints: the module's version as the Go tool
// stamped it (a tag for "go install ...@v1.2.3", "(devel)" for a build in
// the repository) with the commit it was built from, and the Go release.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "multiprobe (no build information)"
	}
	v := "multiprobe " + bi.Main.Version
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = ", modified"
			}
		}
	}
	if rev != "" {
		v += fmt.Sprintf(" (commit %.12s%s)", rev, modified)
	}
	return v + ", " + bi.GoVersion
}

func printUsage(w io.Writer) {
	fmt.Fprintln(w, "usage: multiprobe COMMAND [ARGS]")
	fmt.Fprintln(w)
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	width := 0
	for _, n := range names {
		width = max(width, len(n))
	}
	for _, n := range names {
		fmt.Fprintf(w, "  %-*s  %s\n", width, n, commands[n].short)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "A probe is a spec as bpftrace writes one: uprobe:BINARY:FUNCTIONS,")
	fmt.Fprintln(w, "uretprobe:BINARY:FUNCTIONS or usdt:BINARY:PROVIDER:NAME, with globs.")
	fmt.Fprintln(w, "'multiprobe help COMMAND' (or COMMAND --help) says more about one;")
	fmt.Fprintln(w, "'multiprobe --version' says which multiprobe this is.")
}

// printHelp writes a command's help: usage, what it does, flags, examples.
func printHelp(w io.Writer, name string, c *command) {
	fmt.Fprintf(w, "usage: multiprobe %s %s\n\n%s.\n", name, c.usage, capitalize(c.short))
	if c.long != "" {
		fmt.Fprintf(w, "\n%s\n", c.long)
	}
	if c.fs != nil {
		var flags []*flag.Flag
		width := 0
		c.fs.VisitAll(func(f *flag.Flag) {
			flags = append(flags, f)
			width = max(width, len(flagName(f)))
		})
		if len(flags) > 0 {
			fmt.Fprintln(w, "\nflags:")
		}
		for _, f := range flags {
			_, usage := flag.UnquoteUsage(f)
			if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "false" && f.DefValue != "0s" {
				usage += fmt.Sprintf(" (default %s)", f.DefValue)
			}
			fmt.Fprintf(w, "  %-*s  %s\n", width, flagName(f), usage)
		}
	}
	if len(c.examples) > 0 {
		fmt.Fprintln(w, "\nexamples:")
		for _, e := range c.examples {
			fmt.Fprintf(w, "  multiprobe %s\n", e)
		}
	}
}

// flagName is how help shows a flag: "-p, --pid PID" for a one-letter alias
// (a flag whose usage is "alias for --NAME" is listed with its long form).
func flagName(f *flag.Flag) string {
	dashes := "--"
	if len(f.Name) == 1 {
		dashes = "-"
	}
	name, _ := flag.UnquoteUsage(f)
	if name != "" {
		return dashes + f.Name + " " + name
	}
	return dashes + f.Name
}

// plural is one or many, by n.
func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// newFlagSet returns a flag set for a subcommand whose errors come back as
// usage errors instead of printing the full flag list and exiting; -h and
// --help come back as flag.ErrHelp, for run to print the command's help.
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	if c := commands[name]; c != nil {
		c.fs = fs
	}
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
			return nil, nil, flagError(err)
		}
		args = fs.Args()
		if len(args) == 0 {
			return positional, rest, nil
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
}

// flagErrorRE matches the flag package's "-name" in its error messages:
// "flag provided but not defined: -bogus", "invalid value "x" for flag
// -duration: ...", "invalid boolean value "x" for -json: parse error",
// "flag needs an argument: -pid".
var flagErrorRE = regexp.MustCompile(`^(flag provided but not defined: |invalid value (".*") for flag |invalid boolean value (".*") for |flag needs an argument: )--?([^\s:]+)`)

// flagError turns the flag package's error into a usage error that names
// the flag as the help does: --duration, or -p for a one-letter one.
func flagError(err error) error {
	m := flagErrorRE.FindStringSubmatch(err.Error())
	if m == nil {
		return usagef("%v", err)
	}
	name := "--" + m[4]
	if len(m[4]) == 1 {
		name = "-" + m[4]
	}
	rest := err.Error()[len(m[0]):]
	switch {
	case strings.HasPrefix(m[1], "flag provided"):
		return usagef("unknown flag %s", name)
	case strings.HasPrefix(m[1], "flag needs"):
		return usagef("%s needs a value", name)
	case strings.HasPrefix(m[1], "invalid boolean"):
		return usagef("invalid value %s for %s: want true or false", m[3], name)
	}
	if rest == ": parse error" || rest == ": value out of range" {
		rest = ": want a number" // the flag package's word for strconv's errors
	}
	return usagef("invalid value %s for %s%s", m[2], name, rest)
}
