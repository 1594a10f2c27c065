package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// A series is a kernel series vmrun boots: the newest kernel of Debian's
// cloud flavour in a suite.
type series struct {
	version, suite string
}

var allSeries = map[string]series{
	"5.10": {"5.10", "bullseye"},
	"6.1":  {"6.1", "bookworm"},
	"6.12": {"6.12", "trixie"},
}

// marker starts the line on which the guest reports its tests' status.
const marker = "VMRUN-EXIT="

type options struct {
	kernels  []string
	packages []string
	flags    []string // for every test binary
	files    []string // host programs to copy in
	env      []string
	cache    string
	timeout  time.Duration
	mem      string
	smp      int
	accel    string
	verbose  bool
	keep     bool
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	o, err := parseArgs(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "vmrun: %v\n", err)
		return 2
	}
	failed := 0
	var summary []string
	for _, k := range o.kernels {
		line, err := runKernel(context.Background(), o, allSeries[k], stdout)
		if err != nil {
			failed++
			line = fmt.Sprintf("FAIL Linux %s: %v", k, err)
		}
		summary = append(summary, line)
	}
	for _, l := range summary {
		fmt.Fprintln(stdout, "vmrun:", l)
	}
	if failed > 0 {
		return 1
	}
	return 0
}

func parseArgs(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("vmrun", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &options{}
	kernels := fs.String("kernel", "6.1", "comma-separated kernel `series`: 5.10, 6.1, 6.12")
	files := fs.String("files", "", "comma-separated host `programs` to copy into the guest, with their libraries")
	env := fs.String("env", "", "comma-separated `VAR=value` settings for the tests")
	home, _ := os.UserCacheDir()
	fs.StringVar(&o.cache, "cache", filepath.Join(home, "multiprobe", "oldkernel"), "where downloaded kernels are kept")
	fs.DurationVar(&o.timeout, "timeout", 20*time.Minute, "how long one kernel's tests may take")
	fs.StringVar(&o.mem, "mem", "2G", "guest memory")
	fs.IntVar(&o.smp, "smp", 2, "guest CPUs")
	fs.StringVar(&o.accel, "accel", "", "kvm or tcg (default: kvm where /dev/kvm is usable)")
	fs.BoolVar(&o.verbose, "v", false, "print every test's output, not only failures' (runs the tests with -test.v)")
	fs.BoolVar(&o.keep, "keep", false, "keep the work directory (initramfs, test binaries) and say where")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: vmrun [flags] PACKAGES... [-- TEST FLAGS...]")
		fmt.Fprintln(stderr, "\nRuns the packages' tests on each kernel series in QEMU; see go doc github.com/multiprobe/multiprobe/cmd/vmrun.")
		fs.PrintDefaults()
	}
	for i, a := range args {
		if a == "--" {
			args, o.flags = args[:i], args[i+1:]
			break
		}
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	o.packages = fs.Args()
	if len(o.packages) == 0 {
		o.packages = []string{"."}
	}
	for _, k := range strings.Split(*kernels, ",") {
		k = strings.TrimSpace(k)
		if _, ok := allSeries[k]; !ok {
			return nil, fmt.Errorf("-kernel %s: want 5.10, 6.1 or 6.12", k)
		}
		o.kernels = append(o.kernels, k)
	}
	o.files = splitList(*files)
	o.env = splitList(*env)
	for _, kv := range o.env {
		if !strings.Contains(kv, "=") {
			return nil, fmt.Errorf("-env %q: want VAR=value", kv)
		}
	}
	if o.accel != "" && o.accel != "kvm" && o.accel != "tcg" {
		return nil, fmt.Errorf("-accel %s: want kvm or tcg", o.accel)
	}
	// -v is go test's -v too: the guest prints each test's name and log.
	if o.verbose && !slices.ContainsFunc(o.flags, func(f string) bool { return strings.TrimLeft(f, "-") == "v" || strings.TrimLeft(f, "-") == "test.v" }) {
		o.flags = append([]string{"-test.v"}, o.flags...)
	}
	// A test flag without the "-test." prefix gets it: "-run X" is
	// "-test.run X", as go test takes it.
	for i, f := range o.flags {
		if name, ok := strings.CutPrefix(strings.TrimPrefix(f, "-"), "-"); ok || strings.HasPrefix(f, "-") {
			if !ok {
				name = f[1:]
			}
			if !strings.HasPrefix(name, "test.") {
				o.flags[i] = "-test." + name
			}
		}
	}
	return o, nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// runKernel boots s's kernel with the tests and returns the summary line.
func runKernel(ctx context.Context, o *options, s series, stdout io.Writer) (string, error) {
	if err := hostPackages("qemu-system-x86", "busybox-static"); err != nil {
		return "", err
	}
	kernel, release, err := fetchKernel(o.cache, s)
	if err != nil {
		return "", err
	}
	work, err := os.MkdirTemp("", "vmrun-")
	if err != nil {
		return "", err
	}
	if o.keep {
		fmt.Fprintf(stdout, "vmrun: work directory kept: %s\n", work)
	} else {
		defer os.RemoveAll(work)
	}
	initrd := filepath.Join(work, "initramfs.cpio")
	pkgs, err := buildInitramfs(o, work, initrd)
	if err != nil {
		return "", err
	}
	fmt.Fprintf(stdout, "vmrun: booting Linux %s (%d %s)\n", release, len(pkgs), plural(len(pkgs), "package", "packages"))
	start := time.Now()
	status, missing, err := boot(ctx, o, kernel, initrd, stdout)
	took := time.Since(start).Round(time.Second)
	if err != nil {
		return "", fmt.Errorf("%s, after %v%s", err, took, filesHint(missing))
	}
	if status != 0 {
		return "", fmt.Errorf("tests failed (exit %d) on Linux %s, in %v%s", status, release, took, filesHint(missing))
	}
	return fmt.Sprintf("ok   Linux %s, %d %s, in %v", release, len(pkgs), plural(len(pkgs), "package", "packages"), took), nil
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// hostPackages installs the Debian packages that are missing.
func hostPackages(pkgs ...string) error {
	var need []string
	for _, p := range pkgs {
		out, _ := exec.Command("dpkg-query", "-W", "-f=${Status}", p).Output()
		if !strings.Contains(string(out), "install ok installed") {
			need = append(need, p)
		}
	}
	if len(need) == 0 {
		return nil
	}
	args := append([]string{"install", "-y", "-qq", "--no-install-recommends"}, need...)
	cmd := exec.Command("apt-get", args...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	if out, err := cmd.CombinedOutput(); err != nil {
		if err := exec.Command("apt-get", "update", "-qq").Run(); err == nil {
			cmd = exec.Command("apt-get", args...)
			cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
			out, err = cmd.CombinedOutput()
			if err == nil {
				return nil
			}
		}
		return fmt.Errorf("installing %s (as root): %v\n%s", strings.Join(need, " "), err, out)
	}
	return nil
}

// boot runs QEMU until the guest powers off, copying its console to
// stdout, and returns the status the guest reported and the programs its
// tests could not run.
func boot(ctx context.Context, o *options, kernel, initrd string, stdout io.Writer) (status int, missing []string, err error) {
	accel := o.accel
	if accel == "" {
		// A PVM /dev/kvm boots only PVM-enabled guest kernels; Debian's
		// hang there.
		accel = "tcg"
		if f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0); err == nil {
			f.Close()
			if _, err := os.Stat("/sys/module/kvm_pvm"); err != nil {
				accel = "kvm"
			}
		}
	}
	args := []string{"-accel", "kvm", "-cpu", "host"}
	if accel == "tcg" {
		args = []string{"-accel", "tcg,thread=multi", "-cpu", "max"}
	}
	args = append(args, "-smp", strconv.Itoa(o.smp), "-m", o.mem,
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-chardev", "stdio,id=con", "-serial", "chardev:con",
		"-kernel", kernel, "-initrd", initrd,
		// rcu_expedited: a perf-event uprobe's detach waits for RCU grace
		// periods, which dominate the per-site path's tests under TCG.
		"-append", "console=ttyS0 panic=-1 oops=panic quiet loglevel=3 rcupdate.rcu_expedited=1")
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, nil, err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return 0, nil, fmt.Errorf("starting qemu: %w", err)
	}
	status, missing = readConsole(out, stdout)
	werr := cmd.Wait()
	switch {
	case ctx.Err() != nil:
		return 0, missing, fmt.Errorf("the guest did not finish within -timeout %v", o.timeout)
	case status < 0:
		return 0, missing, fmt.Errorf("the guest stopped without a result (a crash?): qemu: %v", werr)
	}
	return status, missing, nil
}

// missingRE matches what Go's os/exec says when a test runs a program the
// guest does not have.
var missingRE = regexp.MustCompile(`fork/exec (/\S+): no such file or directory|exec: "([^"]+)": executable file not found in \$PATH`)

// readConsole copies the guest's console to stdout, but for the line that
// reports the tests' status, which it returns (-1 if none came), with the
// programs the tests could not run because the guest lacks them.
func readConsole(console io.Reader, stdout io.Writer) (status int, missing []string) {
	status = -1
	sc := bufio.NewScanner(console)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		if v, ok := strings.CutPrefix(line, marker); ok {
			status, _ = strconv.Atoi(v)
			continue
		}
		for _, m := range missingRE.FindAllStringSubmatch(line, -1) {
			if p := m[1] + m[2]; !slices.Contains(missing, p) {
				missing = append(missing, p)
			}
		}
		fmt.Fprintln(stdout, line)
	}
	return status, missing
}

// filesHint says how to give the guest the programs it lacked.
func filesHint(missing []string) string {
	if len(missing) == 0 {
		return ""
	}
	return fmt.Sprintf("; the guest has no %s, which a test ran: copy it in with -files %s",
		strings.Join(missing, " or "), strings.Join(missing, ","))
}

var abiPattern = regexp.MustCompile(`Depends: linux-image-([0-9.]+-[0-9]+)-cloud-amd64`)
