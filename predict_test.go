package multiprobe_test

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/elfsym"
	"github.com/multiprobe/multiprobe/ifunc"
	"github.com/multiprobe/multiprobe/internal/hostarch"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/probetest"
	"golang.org/x/sys/unix"
)

// TestPredictorAgreesWithKernel proves kernelprobe.CheckInsn against the
// kernel on whole real libraries: for every function of each (where the
// probe goes: IFUNCs at their implementations), the sites it accepts
// attach together, in one uprobe_multi link with a live process that maps
// the library as its pid filter (the kernel analyses an instruction when
// it installs the probe in a process), and each site it refuses fails
// alone, as the kernel refuses it. Where the big link fails, the sites
// are bisected to name the one the predictor missed.
func TestPredictorAgreesWithKernel(t *testing.T) {
	probetest.RequireBPF(t)
	f, err := kernelprobe.Detect()
	if err != nil {
		t.Fatal(err)
	}
	if !f.UprobeMulti {
		t.Skip("needs uprobe_multi links (Linux 6.6)")
	}
	t.Setenv("LD_PRELOAD", "")
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: ebpf.Kprobe, AttachType: ebpf.AttachTraceUprobeMulti, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	for _, tc := range []struct {
		target string
		cmd    []string // runs target, or with it preloaded when nil
	}{
		{"libc.so.6", nil}, {"libm.so.6", nil}, {"libz.so.1", nil}, {"libcrypto.so.3", nil}, {"libssl.so.3", nil},
		{"libsqlite3.so.0", nil}, {"libffi.so.8", nil}, {"libstdc++.so.6", nil}, {loaderName(), nil},
		{"bash", []string{"bash", "-c", "read"}},
		{"node", []string{"node", "-e", "setTimeout(() => {}, 1e9)"}},
		{"python3.11", []string{"python3.11", "-c", "import ssl, hashlib, sqlite3, zlib, ctypes, sys; sys.stdin.read()"}},
	} {
		t.Run(tc.target, func(t *testing.T) {
			path, err := elfsym.LookPath(tc.target)
			if err != nil {
				if tc.target == "libc.so.6" {
					t.Fatal(err)
				}
				t.Skip(err) // another machine's names (arm64's loader, no node)
			}
			// A process that maps the file and waits.
			cmd := exec.Command("sleep", "1000")
			if tc.cmd != nil {
				cmd = exec.Command(path, tc.cmd[1:]...) // the file found, not $PATH's
				stdin, err := cmd.StdinPipe()
				if err != nil {
					t.Fatal(err)
				}
				defer stdin.Close()
			} else if !strings.HasPrefix(tc.target, "ld-") { // sleep runs with the loader
				cmd.Env = append(os.Environ(), "LD_PRELOAD="+path)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { cmd.Process.Kill(); cmd.Wait() }()
			waitMapped(t, cmd.Process.Pid, path)

			good, bad := predict(t, path)
			t.Logf("%s: %d sites the predictor accepts, %d it refuses", path, len(good), len(bad))
			ex, err := link.OpenExecutable(path)
			if err != nil {
				t.Fatal(err)
			}
			attach := func(offs []uint64) error {
				l, err := ex.UprobeMulti(nil, prog, &link.UprobeMultiOptions{Addresses: offs, PID: uint32(cmd.Process.Pid)})
				if err == nil {
					l.Close()
				}
				return err
			}
			if err := attach(offsets(good)); err != nil {
				t.Errorf("the sites the predictor accepts do not attach together: %v", err)
				for _, s := range bisect(good, attach) {
					t.Errorf("the kernel refuses %s at %#x, which the predictor accepts", s.Name, s.Offset)
				}
			}
			for _, b := range bad {
				err := attach([]uint64{b.site.Offset})
				if err == nil {
					t.Errorf("the kernel accepts %s at %#x, which the predictor refuses: %v", b.site.Name, b.site.Offset, b.why)
					continue
				}
				if !errors.Is(err, unix.Errno(524)) && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOEXEC) {
					t.Errorf("%s at %#x: %v, want ENOTSUPP (524), ENOEXEC or EINVAL", b.site.Name, b.site.Offset, err)
				}
				t.Logf("refused as predicted: %s at %#x: %v", b.site.Name, b.site.Offset, b.why)
			}
		})
	}
}

// loaderName is the dynamic loader's name on this architecture.
func loaderName() string {
	if runtime.GOARCH == "arm64" {
		return "ld-linux-aarch64.so.1"
	}
	return "ld-linux-x86-64.so.2"
}

type refusal struct {
	site elfsym.Site
	why  error
}

// predict resolves every function of path as multiprobe probes them and
// sorts them by the predictor's verdict.
func predict(t *testing.T, path string) (good []elfsym.Site, bad []refusal) {
	fd, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	f, err := elfsym.OpenFile(fd)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sites, err := f.Resolve("*")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[uint64]bool{}
	for _, s := range ifunc.Sites(fd, sites) {
		if seen[s.Offset] {
			continue
		}
		seen[s.Offset] = true
		code := make([]byte, kernelprobe.InsnWindow)
		n, _ := fd.ReadAt(code, int64(s.Offset))
		if err := kernelprobe.CheckInsn(hostarch.Machine, code[:n]); err != nil {
			bad = append(bad, refusal{s, err})
		} else {
			good = append(good, s)
		}
	}
	return good, bad
}

func offsets(sites []elfsym.Site) []uint64 {
	out := make([]uint64, len(sites))
	for i, s := range sites {
		out[i] = s.Offset
	}
	return out
}

// bisect returns the sites that attach refuses, halving the sets that fail.
func bisect(sites []elfsym.Site, attach func([]uint64) error) []elfsym.Site {
	if attach(offsets(sites)) == nil {
		return nil
	}
	if len(sites) == 1 {
		return sites
	}
	h := len(sites) / 2
	return append(bisect(sites[:h], attach), bisect(sites[h:], attach)...)
}

// waitMapped waits until process pid maps path.
func waitMapped(t *testing.T, pid int, path string) {
	t.Helper()
	for range 500 {
		maps, err := elfsym.ExecutableMappings(pid)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range maps {
			if same, _ := sameFile(m.Path, path); same {
				return
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("process %d does not map %s", pid, path)
}

func sameFile(a, b string) (bool, error) {
	sa, err := os.Stat(a)
	if err != nil {
		return false, err
	}
	sb, err := os.Stat(b)
	if err != nil {
		return false, err
	}
	return os.SameFile(sa, sb), nil
}

// TestLeftOut: a glob leaves out the sites the kernel would refuse, each
// with its reason, and attaches the rest to a live process; the same
// function named exactly is an error that names it and its instruction.
func TestLeftOut(t *testing.T) {
	probetest.RequireBPF(t)
	if hostarch.Machine != elf.EM_X86_64 {
		t.Skip("pthread_spin_lock starts with lock decl on x86-64")
	}
	pl, err := multiprobe.Resolve(mustParse(t, "uprobe:libc.so.6:pthread_spin_*"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Close()
	left := pl.LeftOut()
	if len(left) != 1 || left[0].Name != "pthread_spin_lock" || !errors.Is(left[0].LeftOut, kernelprobe.ErrUnprobeable) {
		t.Fatalf("left out %v, want pthread_spin_lock, unprobeable", left)
	}
	for _, s := range pl.Sites() {
		if s.Name == "pthread_spin_lock" || s.LeftOut != nil {
			t.Errorf("site %s (%v) in the plan", s.Name, s.LeftOut)
		}
	}
	cmd := exec.Command("sleep", "1000")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	waitMapped(t, cmd.Process.Pid, left[0].Path)
	f, err := kernelprobe.Detect()
	if err != nil {
		t.Fatal(err)
	}
	glob := "*"
	if f.Path() != kernelprobe.PathUprobeMulti {
		glob = "pthread_spin_*" // per-site perf-event uprobes take a while each
	}
	c, plans := setup(t, f, multiprobe.Options{PID: cmd.Process.Pid}, []string{"uprobe:libc.so.6:" + glob})
	if l, err := plans[0].Attach(c.CountEntry); err != nil {
		t.Errorf("all of libc but what is left out, on a live process: %v", err)
	} else {
		l.Close()
	}

	_, err = multiprobe.Resolve(mustParse(t, "uprobe:libc.so.6:pthread_spin_lock"), nil)
	if !errors.Is(err, kernelprobe.ErrUnprobeable) || !strings.Contains(err.Error(), "pthread_spin_lock") || !strings.Contains(err.Error(), "lock decl (%rdi)") {
		t.Errorf("exact name: %v, want an error naming pthread_spin_lock and lock decl (%%rdi), wrapping ErrUnprobeable", err)
	}
}

// TestReturnGlobKeepsEntryPoints attaches a return probe to every function
// of a C program and of bash, _start among them: the entry point is left
// out (a return probe there overwrote argc), and the programs run as
// without probes, with every function's returns counted. Both paths; bash
// only on uprobe_multi (its 1,700 perf-event uprobes take a minute).
func TestReturnGlobKeepsEntryPoints(t *testing.T) {
	const n, calls = 5, 2
	target := testprogs.PrivateTarget(t, n)
	forEachPath(t, func(t *testing.T, f kernelprobe.Features) {
		for _, tc := range []struct {
			path   string
			args   []string
			status int
			out    string
		}{
			{target, []string{fmt.Sprint(calls)}, 0, ""},
			{"/bin/bash", []string{"-c", "echo hi; exit 7"}, 7, "hi\n"},
		} {
			if tc.path != target && f.Path() != kernelprobe.PathUprobeMulti {
				continue
			}
			p, err := probetest.Start(commandOutput(tc.path, tc.args...))
			if err != nil {
				t.Fatal(err)
			}
			c, plans := setup(t, f, multiprobe.Options{PID: p.PID()}, []string{"uretprobe:" + tc.path + ":*"})
			var entry bool
			for _, s := range plans[0].LeftOut() {
				entry = entry || errors.Is(s.LeftOut, multiprobe.ErrNoReturnAddress) && s.Name == "_start"
			}
			if !entry {
				t.Errorf("%s: _start not left out: %v", tc.path, plans[0].LeftOut())
			}
			l, err := plans[0].Attach(c.RecordReturn)
			if err != nil {
				p.Kill()
				t.Fatal(err)
			}
			if err := p.Resume(); err != nil {
				t.Fatal(err)
			}
			status, err := p.Wait()
			l.Close()
			if out := p.Cmd.Stdout.(*strings.Builder).String(); status != tc.status || err != nil || tc.out != "" && out != tc.out {
				t.Errorf("%s %q under return probes: status %d (%v), output %q; want %d, %q", tc.path, tc.args, status, err, out, tc.status, tc.out)
			}
			sites := l.Sites()
			rets, err := testprogs.ReadArray(c.RetCounts, len(sites))
			if err != nil {
				t.Fatal(err)
			}
			var total uint64
			for i, s := range sites {
				total += rets[i]
				if tc.path == target && strings.HasPrefix(s.Name, "func_") {
					if k := funcIndex(t, s.Name); rets[i] != uint64(testprogs.ExpectedCalls(k, calls)) {
						t.Errorf("%s: %d returns, want %d", s.Name, rets[i], testprogs.ExpectedCalls(k, calls))
					}
				}
			}
			if total == 0 {
				t.Errorf("%s: no returns counted", tc.path)
			}
		}
	})
}

// commandOutput is a command whose output a strings.Builder keeps.
func commandOutput(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Stdout = &strings.Builder{}
	return cmd
}

// TestReplacedExecutable starts a program stopped, replaces its file by a
// rename (as an upgrade or a build does) and only then resolves the
// program's path with its pid: the probes go on the file the process
// runs, not the new one at the path, and count its calls exactly.
func TestReplacedExecutable(t *testing.T) {
	const n, calls = 5, 2
	forEachPath(t, func(t *testing.T, f kernelprobe.Features) {
		path := testprogs.PrivateTarget(t, n)
		p := probetest.StartStopped(t, path, fmt.Sprint(calls))
		// Another program at the path: more functions, at other offsets.
		other := testprogs.PrivateTarget(t, 20)
		if err := os.Rename(other, path); err != nil {
			t.Fatal(err)
		}
		c, plans := setup(t, f, multiprobe.Options{PID: p.PID()}, []string{"uprobe:" + path + ":func_*"})
		l := mustAttach(t, plans[0], c.CountEntry)
		if err := p.Resume(); err != nil {
			t.Fatal(err)
		}
		if status, err := p.Wait(); status != 0 || err != nil {
			t.Fatalf("status %d, %v", status, err)
		}
		sites := l.Sites()
		if len(sites) != n {
			t.Fatalf("%d sites, want the running program's %d", len(sites), n)
		}
		want := map[string]uint64{}
		for i := range n {
			want[testprogs.FuncName(i)] = uint64(testprogs.ExpectedCalls(i, calls))
		}
		probetest.CheckCounts(t, sites, c.Counts, want)
	})
}

// TestDebugSymbolCounted counts libc's _int_malloc, a local function only
// libc6-dbg's debug file names, in one run of ls, and as a reference at
// the offset debug/elf computes from the debug file's symbol through a
// perf-event uprobe of cilium/ebpf's: the same count, more than none.
func TestDebugSymbolCounted(t *testing.T) {
	probetest.RequireBPF(t)
	lib, err := elfsym.LookPath("libc.so.6")
	if err != nil {
		t.Fatal(err)
	}
	f, err := elfsym.Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	debug := f.DebugFile()
	f.Close()
	if debug == "" {
		if os.Getenv("CI") == "true" && !testutil.InGuest() {
			t.Fatal("no debug file for libc: is libc6-dbg installed?")
		}
		t.Skip("no debug file for libc (install libc6-dbg; a test VM has none, the host runs this test)")
	}
	off := symbolOffset(t, lib, debug, "_int_malloc")
	feat, err := kernelprobe.Detect()
	if err != nil {
		t.Fatal(err)
	}
	p := probetest.StartStopped(t, "ls", "-l", "/usr/bin")
	c, plans := setup(t, feat, multiprobe.Options{PID: p.PID()}, []string{"uprobe:libc.so.6:_int_malloc"})
	mustAttach(t, plans[0], c.CountEntry)
	if s := plans[0].Sites(); len(s) != 1 || s[0].Offset != off {
		t.Fatalf("sites %v, want _int_malloc at %#x", s, off)
	}
	ref, err := testprogs.LoadCounter(kernelprobe.PathPerfEvent)
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	ex, err := link.OpenExecutable(lib)
	if err != nil {
		t.Fatal(err)
	}
	rl, err := ex.Uprobe("", ref.CountEntry, &link.UprobeOptions{Address: off, PID: p.PID()})
	if err != nil {
		t.Fatal(err)
	}
	defer rl.Close()
	if err := p.Resume(); err != nil {
		t.Fatal(err)
	}
	if status, err := p.Wait(); status != 0 || err != nil {
		t.Fatalf("ls: %d, %v", status, err)
	}
	got, err := testprogs.ReadArray(c.Counts, 1)
	if err != nil {
		t.Fatal(err)
	}
	want, err := testprogs.ReadArray(ref.Counts, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got[0] != want[0] || want[0] == 0 {
		t.Errorf("_int_malloc: %d calls, the reference %d", got[0], want[0])
	}
	t.Logf("_int_malloc at %#x: %d calls", off, got[0])
}

// symbolOffset finds name in the debug file with debug/elf and converts
// its address to a file offset of lib through lib's program headers.
func symbolOffset(t *testing.T, lib, debug, name string) uint64 {
	t.Helper()
	d, err := elf.Open(debug)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	syms, err := d.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	l, err := elf.Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, s := range syms {
		if s.Name != name {
			continue
		}
		for _, p := range l.Progs {
			if p.Type == elf.PT_LOAD && s.Value >= p.Vaddr && s.Value < p.Vaddr+p.Filesz {
				return s.Value - p.Vaddr + p.Off
			}
		}
	}
	t.Fatalf("%s: no %s", debug, name)
	return 0
}

// TestPrivateMountNamespace probes a program run, in a mount namespace of
// its own, from a directory bind-mounted there only: by the path the
// process sees, with its pid, a USDT probe and a function, each call
// counted. Its root directory is this process's, so only its mount
// namespace says that its paths are its own.
func TestPrivateMountNamespace(t *testing.T) {
	probetest.RequireBPF(t)
	const n = 5
	p, inside := testprogs.StartInPrivateMount(t, testprogs.USDTTarget(t), "-wait", fmt.Sprint(n))
	if root := elfsym.ProcessRoot(p.PID()); root != fmt.Sprintf("/proc/%d/root", p.PID()) {
		t.Fatalf("ProcessRoot(%d) = %q, want its /proc/PID/root", p.PID(), root)
	}
	f, err := kernelprobe.Detect()
	if err != nil {
		t.Fatal(err)
	}
	opts := multiprobe.Options{PID: p.PID(), Features: &f}
	usdtPlan, err := multiprobe.Resolve(mustParse(t, "usdt:"+inside+":mp:tick"), &opts)
	if err != nil {
		t.Fatal(err)
	}
	defer usdtPlan.Close()
	spec, err := testprogs.USDTCounterSpec()
	if err != nil {
		t.Fatal(err)
	}
	if err := usdtPlan.Prepare(spec); err != nil {
		t.Fatal(err)
	}
	uc, err := testprogs.NewUSDTCounter(spec)
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	ul := mustAttach(t, usdtPlan, uc.CountUSDT)
	c, plans := setup(t, f, multiprobe.Options{PID: p.PID()}, []string{"uprobe:" + inside + ":report"})
	mustAttach(t, plans[0], c.CountEntry)

	if out := p.Finish(t); !strings.HasPrefix(out, "done") {
		t.Fatalf("target printed %q", out)
	}
	hits, err := testprogs.ReadArray(uc.Hits, len(ul.Sites()))
	if err != nil {
		t.Fatal(err)
	}
	var ticks uint64
	for _, h := range hits {
		ticks += h
	}
	if ticks != n {
		t.Errorf("mp:tick fired %d times, want %d", ticks, n)
	}
	probetest.CheckCounts(t, plans[0].Sites(), c.Counts, map[string]uint64{"report": 1})
}

// TestTargetGlobs resolves a glob in a target's path, to every file it
// matches, and "*" with a pid, to every file the process maps: one link
// per file, each file's calls counted. Both paths.
func TestTargetGlobs(t *testing.T) {
	const n, calls = 5, 2
	src := testprogs.PrivateTarget(t, n)
	dir := t.TempDir()
	var copies []string
	for _, d := range []string{"a", "b"} {
		copies = append(copies, filepath.Join(dir, d, "target"))
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(copies[len(copies)-1], data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]uint64{}
	for i := range n {
		want[testprogs.FuncName(i)] = 2 * uint64(testprogs.ExpectedCalls(i, calls)) // one run of each copy
	}
	forEachPath(t, func(t *testing.T, f kernelprobe.Features) {
		c, plans := setup(t, f, multiprobe.Options{}, []string{"uprobe:" + dir + "/*/target:func_*"})
		l := mustAttach(t, plans[0], c.CountEntry)
		if got := len(l.Sites()); got != 2*n {
			t.Fatalf("%d sites, want %d in each of 2 files", got, n)
		}
		for _, p := range copies {
			runTarget(t, p, calls)
		}
		probetest.CheckCounts(t, l.Sites(), c.Counts, want)
	})

	t.Run("* with a pid", func(t *testing.T) {
		f, err := kernelprobe.Detect()
		if err != nil {
			t.Fatal(err)
		}
		p := probetest.StartStopped(t, copies[0], fmt.Sprint(calls))
		c, plans := setup(t, f, multiprobe.Options{PID: p.PID()}, []string{"uprobe:*:func_*"})
		l := mustAttach(t, plans[0], c.CountEntry)
		if err := p.Resume(); err != nil {
			t.Fatal(err)
		}
		if status, err := p.Wait(); status != 0 || err != nil {
			t.Fatalf("status %d, %v", status, err)
		}
		half := map[string]uint64{}
		for k, v := range want {
			half[k] = v / 2
		}
		probetest.CheckCounts(t, l.Sites(), c.Counts, half)
		if _, err := multiprobe.Resolve(mustParse(t, "uprobe:*:func_*"), nil); !errors.Is(err, multiprobe.ErrBadSpec) {
			t.Errorf("uprobe:*:func_* without a pid: %v, want ErrBadSpec", err)
		}
	})
}
