package main

import (
	"bufio"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// A testPackage is a package whose test binary the guest runs, in dir (its
// directory relative to the module's root), as go test would.
type testPackage struct {
	importPath, dir, hostDir string
}

// buildInitramfs builds the test binaries and writes the initramfs that
// runs them. It returns the packages it will run.
func buildInitramfs(o *options, work, initrd string) ([]testPackage, error) {
	pkgs, err := listPackages(o.packages)
	if err != nil {
		return nil, err
	}
	if len(pkgs) == 0 {
		return nil, fmt.Errorf("no package with tests among %s", strings.Join(o.packages, " "))
	}
	a := newArchive()
	for _, d := range []string{"usr", "usr/bin", "usr/lib", "usr/lib64", "usr/local", "usr/local/bin", "proc", "sys", "dev", "root", "src", "cache"} {
		a.dir(d, 0o755)
	}
	a.dir("tmp", 0o1777)
	for _, l := range [][2]string{{"bin", "usr/bin"}, {"lib", "usr/lib"}, {"lib64", "usr/lib64"}} {
		a.symlink(l[0], l[1])
	}
	busybox, err := filepath.EvalSymlinks("/bin/busybox")
	if err != nil {
		return nil, fmt.Errorf("busybox: %w (install busybox-static)", err)
	}
	a.file("usr/bin/busybox", busybox, 0o755)
	for i, p := range pkgs {
		bin := filepath.Join(work, fmt.Sprintf("%d.test", i))
		// Static, so that the guest needs no Go or C library; DWARF
		// dropped (-w), the symbol table kept: a test may probe its own
		// binary.
		cmd := exec.Command("go", "test", "-c", "-ldflags=-w", "-o", bin, p.importPath)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOARCH=amd64")
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("building the tests of %s: %v\n%s", p.importPath, err, out)
		}
		a.mkdirAll(path.Join("src", p.dir))
		a.file(path.Join("src", p.dir, "pkg.test"), bin, 0o755)
		if err := a.tree(filepath.Join(p.hostDir, "testdata"), path.Join("src", p.dir, "testdata")); err != nil {
			return nil, err
		}
	}
	// The C targets probetest.BuildC built on the host: the guest has no
	// compiler, and finds them in the cache under the same key.
	var programs []string
	if root := hostCache(); root != "" {
		cache := filepath.Join(root, "probetest")
		if err := a.tree(cache, "cache/probetest"); err != nil {
			return nil, err
		}
		// And the libraries they load (with the dynamic loader).
		filepath.WalkDir(cache, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			if info, err := d.Info(); err == nil && info.Mode().IsRegular() && info.Mode().Perm()&0o111 != 0 {
				programs = append(programs, p)
			}
			return nil
		})
	}
	if err := addPrograms(a, o.files, programs); err != nil {
		return nil, err
	}
	a.data("init", []byte(initScript(o, pkgs)), 0o755)

	f, err := os.Create(initrd)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	w := bufio.NewWriter(f)
	if err := a.write(w); err != nil {
		return nil, err
	}
	if err := w.Flush(); err != nil {
		return nil, err
	}
	return pkgs, f.Close()
}

// listPackages resolves the patterns to the packages that have tests.
func listPackages(patterns []string) ([]testPackage, error) {
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		return nil, fmt.Errorf("go list -m: %w (run vmrun in a module)", err)
	}
	modRoot := strings.TrimSpace(strings.SplitN(string(root), "\n", 2)[0])
	args := append([]string{"list", "-f", "{{.ImportPath}}\t{{.Dir}}\t{{len .TestGoFiles}}\t{{len .XTestGoFiles}}"}, patterns...)
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return nil, fmt.Errorf("go list %s: %s", strings.Join(patterns, " "), ee.Stderr)
		}
		return nil, err
	}
	var pkgs []testPackage
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "\t")
		if len(f) != 4 || f[2] == "0" && f[3] == "0" {
			continue
		}
		rel, err := filepath.Rel(modRoot, f[1])
		if err != nil || strings.HasPrefix(rel, "..") {
			rel = strings.ReplaceAll(f[0], "/", "_")
		}
		pkgs = append(pkgs, testPackage{importPath: f[0], dir: filepath.ToSlash(rel), hostDir: f[1]})
	}
	return pkgs, nil
}

// hostCache is probetest's cache root on the host.
func hostCache() string {
	if d := os.Getenv("MULTIPROBE_CACHE_DIR"); d != "" {
		return d
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(d, "multiprobe")
}

var lddPath = regexp.MustCompile(`(/[^ ]+)`)

// addPrograms copies host programs into the guest at their paths, and
// the shared libraries ldd says they, and the programs already in the
// archive (built), load.
func addPrograms(a *archive, programs, built []string) error {
	seen := map[string]bool{}
	var all []string
	for _, p := range programs {
		abs, err := exec.LookPath(p)
		if err != nil {
			return fmt.Errorf("-files %s: %w", p, err)
		}
		all = append(all, abs)
		built = append(built, abs)
	}
	for _, p := range built {
		out, _ := exec.Command("ldd", p).Output() // fails on static programs: nothing to add
		for _, m := range lddPath.FindAllString(string(out), -1) {
			if !strings.HasPrefix(m, "/") || strings.Contains(m, "(") {
				continue
			}
			all = append(all, m)
		}
	}
	for _, p := range all {
		if seen[p] {
			continue
		}
		seen[p] = true
		real, err := filepath.EvalSymlinks(p)
		if err != nil {
			return err
		}
		st, err := os.Stat(real)
		if err != nil {
			return err
		}
		at := a.canonical(real)
		a.mkdirAll(path.Dir(at))
		a.file(at, real, st.Mode().Perm())
		if name := a.canonical(p); name != at {
			// Also the name programs ask for (/lib64/ld-linux-x86-64.so.2).
			a.mkdirAll(path.Dir(name))
			a.symlink(name, real)
		}
	}
	return nil
}

// squote quotes a word for a POSIX shell.
func squote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// initScript is the guest's /init: it mounts what tests need, runs each
// test binary in its package's directory, as go test does, and reports the
// first failing status on the marker line before it powers off.
func initScript(o *options, pkgs []testPackage) string {
	var b strings.Builder
	b.WriteString(`#!/bin/busybox sh
/bin/busybox mkdir -p /usr/local/sbin
/bin/busybox --install -s /usr/local/sbin
export PATH=/usr/local/bin:/usr/bin:/usr/local/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tracefs tracefs /sys/kernel/tracing
mount -t debugfs debugfs /sys/kernel/debug
mount -t bpf bpf /sys/fs/bpf
mount -t cgroup2 cgroup2 /sys/fs/cgroup
ulimit -l unlimited
ulimit -n 1048576
export HOME=/root TMPDIR=/tmp CI=true MULTIPROBE_CACHE_DIR=/cache MULTIPROBE_GUEST=1
echo "vmrun guest: Linux $(uname -r), $(nproc) CPUs, $(free -m | awk '/Mem:/ { print $2 }') MB"
status=0
run_pkg() {
	p=$2
	cd "/src/$1" || { status=1; return; }
	shift 2
	start=$(date +%s)
	./pkg.test -test.count=1 -test.timeout="$TEST_TIMEOUT" "$@" >/tmp/out 2>&1
	rc=$?
	took=$(($(date +%s) - start))
	if [ $rc != 0 ] || [ -n "$VERBOSE" ]; then
		tail -c 262144 /tmp/out
	fi
	if [ $rc = 0 ]; then
		echo "ok   $p ${took}s"
	else
		echo "FAIL $p ${took}s (exit $rc)"
		[ $status = 0 ] && status=$rc
	fi
}
`)
	verbose := o.verbose
	for _, f := range o.flags {
		verbose = verbose || f == "-test.v" || f == "-test.v=true"
	}
	if verbose {
		b.WriteString("VERBOSE=1\n")
	} else {
		b.WriteString("VERBOSE=\n")
	}
	for _, kv := range o.env {
		fmt.Fprintf(&b, "export %s\n", squote(kv))
	}
	// Go's own timeout fires first, so that a hung test shows its stacks.
	fmt.Fprintf(&b, "TEST_TIMEOUT=%ds\n", max(int(o.timeout.Seconds())-60, int(o.timeout.Seconds())*3/4))
	for _, p := range pkgs {
		fmt.Fprintf(&b, "run_pkg %s %s", squote(p.dir), squote(p.importPath))
		for _, f := range o.flags {
			fmt.Fprintf(&b, " %s", squote(f))
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "echo \"%s$status\"\npoweroff -f\n", marker)
	return b.String()
}

// An archive is an initramfs being put together: a newc cpio archive, as
// the kernel unpacks it, written in one go.
type archive struct {
	entries map[string]entry
}

type entry struct {
	mode uint32 // type and permission bits, as stat's st_mode
	src  string // a host file's contents
	data []byte // or these, or a symlink's target
}

const (
	modeDir     = 0o040000
	modeRegular = 0o100000
	modeSymlink = 0o120000
)

func newArchive() *archive { return &archive{entries: map[string]entry{}} }

func (a *archive) dir(name string, perm uint32) { a.entries[name] = entry{mode: modeDir | perm} }

// mkdirAll adds name and its parents as directories, where they are not
// there yet.
func (a *archive) mkdirAll(name string) {
	for d := name; d != "." && d != "/" && d != ""; d = path.Dir(d) {
		if _, ok := a.entries[d]; !ok {
			a.entries[d] = entry{mode: modeDir | 0o755}
		}
	}
}

// canonical returns where the host path p is in the archive: through the
// archive's top-level directory links (lib -> usr/lib), since the kernel
// unpacks entries in order and the link's target may not exist yet when
// an entry under the link comes.
func (a *archive) canonical(p string) string {
	p = strings.TrimPrefix(path.Clean(p), "/")
	first, rest, _ := strings.Cut(p, "/")
	if e, ok := a.entries[first]; ok && e.mode&0o170000 == modeSymlink && rest != "" {
		return path.Join(string(e.data), rest)
	}
	return p
}

func (a *archive) symlink(name, target string) {
	a.entries[name] = entry{mode: modeSymlink | 0o777, data: []byte(target)}
}

func (a *archive) file(name, src string, perm fs.FileMode) {
	a.entries[name] = entry{mode: modeRegular | uint32(perm), src: src}
}

func (a *archive) data(name string, data []byte, perm uint32) {
	a.entries[name] = entry{mode: modeRegular | perm, data: data}
}

// tree adds the host directory src at name, if src exists.
func (a *archive) tree(src, name string) error {
	if _, err := os.Stat(src); err != nil {
		return nil
	}
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		dst := path.Join(name, filepath.ToSlash(rel))
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			a.mkdirAll(dst)
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			a.symlink(dst, target)
		case info.Mode().IsRegular():
			a.mkdirAll(path.Dir(dst))
			a.file(dst, p, info.Mode().Perm())
		}
		return nil
	})
}

// write writes the archive in newc format, parents before children.
func (a *archive) write(w io.Writer) error {
	names := make([]string, 0, len(a.entries))
	for n := range a.entries {
		names = append(names, n)
	}
	sort.Strings(names)
	ino := uint32(1)
	for _, n := range names {
		e := a.entries[n]
		data := e.data
		if e.src != "" {
			var err error
			if data, err = os.ReadFile(e.src); err != nil {
				return err
			}
		}
		if err := writeEntry(w, ino, n, e.mode, data); err != nil {
			return err
		}
		ino++
	}
	return writeEntry(w, 0, "TRAILER!!!", 0, nil)
}

// writeEntry writes one newc header, name and data, each padded to four
// bytes.
func writeEntry(w io.Writer, ino uint32, name string, mode uint32, data []byte) error {
	nlink := 1
	if mode&0o170000 == modeDir {
		nlink = 2
	}
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		ino, mode, 0, 0, nlink, 0, len(data), 0, 0, 0, 0, len(name)+1, 0)
	buf := append([]byte(hdr), name...)
	buf = append(buf, 0)
	buf = append(buf, make([]byte, pad4(len(buf)))...)
	if _, err := w.Write(buf); err != nil {
		return err
	}
	if _, err := w.Write(data); err != nil {
		return err
	}
	_, err := w.Write(make([]byte, pad4(len(data))))
	return err
}

func pad4(n int) int { return (4 - n%4) % 4 }
