package multiprobe_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/attach"
	"github.com/multiprobe/multiprobe/fallback"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/probetest"
	"golang.org/x/sys/unix"
)

// TestSwapLoop renames two builds of a target over one path while a plan
// of that path is prepared and attached, 25 times: the probes must land in
// the build that was resolved (its own calls counted exactly, the other
// build's never, and neither dies of a breakpoint in the middle of an
// instruction), and a build changed in place between Resolve and Attach
// must be refused with ErrFileChanged.
func TestSwapLoop(t *testing.T) {
	for _, f := range paths(t)[:1] { // the kernel's own path
		const runs, calls = 25, 2
		n := sitesFor(f, 20, 5)
		// Two builds whose functions sit at other offsets.
		// (Sizes the VM runner builds for its guests.)
		a, b := testprogs.BuildTarget(t, n), testprogs.BuildTarget(t, sitesFor(f, 100, 20))
		dir := t.TempDir()
		path := filepath.Join(dir, "target")
		spec, err := testprogs.CounterSpec()
		if err != nil {
			t.Fatal(err)
		}
		opts := multiprobe.Options{Features: &f}
		// One prepared spec serves every plan: they share features and
		// options, and so what Prepare does.
		first, err := multiprobe.Resolve(mustParse(t, "uprobe:"+a+":func_*"), &opts)
		if err != nil {
			t.Fatal(err)
		}
		if err := first.Prepare(spec); err != nil {
			t.Fatal(err)
		}
		first.Close()
		c, err := testprogs.NewCounter(spec)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()

		for run := range runs {
			// This run's build of a, linked at path: the file the plan
			// must probe whatever happens to path.
			resolved := filepath.Join(dir, "a-run")
			copyFile(t, a, resolved)
			install(t, resolved, path)
			pl, err := multiprobe.Resolve(mustParse(t, "uprobe:"+path+":func_*"), &opts)
			if err != nil {
				t.Fatal(err)
			}
			// Again on the loaded program's spec: without kernel
			// cookies, Attach clones what this plan's Prepare kept.
			if err := pl.Prepare(spec); err != nil {
				t.Fatal(err)
			}
			inPlace := run%5 == 4
			var wg sync.WaitGroup
			if inPlace {
				// The resolved inode itself rewritten with the other
				// build: its offsets no longer name its functions.
				copyInto(t, b, resolved)
			} else {
				wg.Go(func() {
					for i := range 20 {
						if err := swap([]string{b, a}[i%2], path); err != nil {
							t.Error(err)
							return
						}
					}
				})
			}
			before, err := testprogs.ReadArray(c.Counts, n)
			if err != nil {
				t.Fatal(err)
			}
			l, err := pl.Attach(c.CountEntry)
			wg.Wait()
			pl.Close()
			if inPlace {
				if !errors.Is(err, multiprobe.ErrFileChanged) {
					t.Fatalf("run %d: Attach after an in-place change: %v, want ErrFileChanged", run, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("run %d: %v", run, err)
			}
			// The build now at path, whichever it is, and b are other
			// files: they run unprobed and intact.
			for _, other := range []string{path, b} {
				runUnharmed(t, other, calls)
			}
			runUnharmed(t, resolved, calls)
			after, err := testprogs.ReadArray(c.Counts, n)
			if err != nil {
				t.Fatal(err)
			}
			for cookie, s := range l.Sites() {
				i := funcIndex(t, s.Name)
				if got, want := after[cookie]-before[cookie], uint64(testprogs.ExpectedCalls(i, calls)); got != want {
					t.Errorf("run %d: %s counted %d calls, want %d (those of the resolved build alone)", run, s.Name, got, want)
				}
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// runUnharmed runs a target and fails t if it did not exit 0, naming a
// SIGILL or SIGTRAP, which a breakpoint at a wrong offset would raise.
func runUnharmed(t *testing.T, path string, calls int) {
	t.Helper()
	err := exec.Command(path, fmt.Sprint(calls)).Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			t.Fatalf("%s died of %v", path, ws.Signal())
		}
	}
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// copyFile writes a new file at dst (a new inode) with src's contents.
func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		t.Fatal(err)
	}
}

// copyInto overwrites the file dst in place (the same inode) with src.
func copyInto(t *testing.T, src, dst string) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, data, 0o755); err != nil {
		t.Fatal(err)
	}
}

// swap renames a fresh copy of build over path.
func swap(build, path string) error {
	data, err := os.ReadFile(build)
	if err != nil {
		return err
	}
	tmp := path + ".swap"
	if err := os.WriteFile(tmp, data, 0o755); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// install makes path name the inode of file, atomically: a hard link
// renamed over it.
func install(t *testing.T, file, path string) {
	t.Helper()
	tmp := path + ".link"
	os.Remove(tmp)
	if err := os.Link(file, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestMisuse checks that what a plan needs and a program lacks, or a probe
// Resolve cannot use, is an error that says so, never a silent zero count
// or a panic.
func TestMisuse(t *testing.T) {
	f := paths(t)[0]
	target := testprogs.PrivateTarget(t, 5)
	opts := multiprobe.Options{Features: &f}

	t.Run("probes", func(t *testing.T) {
		for _, tt := range []struct {
			name   string
			probes []multiprobe.Probe
		}{
			{"nil", nil},
			{"unknown kind", []multiprobe.Probe{{Kind: multiprobe.Kind(7), Target: target, Patterns: []string{"func_*"}}}},
			{"no target", []multiprobe.Probe{{Kind: multiprobe.Entry, Patterns: []string{"func_*"}}}},
			{"nil patterns", []multiprobe.Probe{{Kind: multiprobe.Entry, Target: target}}},
			{"empty pattern", []multiprobe.Probe{{Kind: multiprobe.Return, Target: target, Patterns: []string{""}}}},
			{"only exclusions", []multiprobe.Probe{{Kind: multiprobe.Entry, Target: target, Patterns: []string{"!func_*"}}}},
			{"usdt without name", []multiprobe.Probe{{Kind: multiprobe.USDT, Target: target, Patterns: []string{"mp"}}}},
			{"usdt two patterns", []multiprobe.Probe{{Kind: multiprobe.USDT, Target: target, Patterns: []string{"a:b", "c:d"}}}},
		} {
			t.Run(tt.name, func(t *testing.T) {
				pl, err := multiprobe.Resolve(tt.probes, &opts)
				if err == nil {
					pl.Close()
					t.Fatal("resolved")
				}
				if !errors.Is(err, multiprobe.ErrBadSpec) {
					t.Errorf("%v, want ErrBadSpec", err)
				}
			})
		}
	})

	t.Run("pid of no program", func(t *testing.T) {
		// A zombie (started, never waited for) and a kernel thread
		// (kthreadd) exist but run no program: they would count nothing.
		zombie := exec.Command("true")
		if err := zombie.Start(); err != nil {
			t.Fatal(err)
		}
		defer zombie.Wait()
		for deadline := time.Now().Add(5 * time.Second); ; {
			stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", zombie.Process.Pid))
			if strings.Contains(string(stat), ") Z ") || time.Now().After(deadline) {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		for _, pid := range []int{zombie.Process.Pid, 2} {
			pl, err := multiprobe.Resolve(mustParse(t, "uprobe:"+target+":func_*"), &multiprobe.Options{Features: &f, PIDs: []int{pid}})
			if err == nil {
				pl.Close()
				t.Fatalf("pid %d: resolved", pid)
			}
			if !errors.Is(err, unix.ESRCH) || !strings.Contains(err.Error(), "runs no program") {
				t.Errorf("pid %d: %v, want ESRCH saying it runs no program", pid, err)
			}
		}
	})

	// A spec loaded without the plan's Prepare (as it is, or prepared for
	// the path alone), on each path, with and without a pid set: the
	// error says what to call, in one line, and tells no one to give
	// Options.PIDs who gave them.
	t.Run("not prepared", func(t *testing.T) {
		for _, f := range paths(t) {
			for _, forPath := range []bool{false, true} {
				for _, pids := range [][]int{nil, {os.Getpid()}} {
					t.Run(fmt.Sprintf("%s/forpath=%v/pids=%v", f.Path(), forPath, pids != nil), func(t *testing.T) {
						testNotPrepared(t, f, target, forPath, pids)
					})
				}
			}
		}
	})

	// What a caller does to the sites it was given changes neither the
	// plan's next answer nor what Attach probes: the counts land on the
	// functions the plan resolved.
	t.Run("sites changed by the caller", func(t *testing.T) {
		c, plans := setup(t, f, multiprobe.Options{}, []string{"uprobe:" + target + ":func_*"})
		pl := plans[0]
		before := pl.Sites()
		got := pl.Sites()
		for i := range got {
			got[i].Offset, got[i].Name, got[i].Cookie = 0, "changed", 99
			got[i].Probe.Patterns[0] = "changed"
			got[i].Probe.Target = "/changed"
			got[i].Symbol.Offset = 0
			if len(got[i].Symbol.Aliases) > 0 {
				got[i].Symbol.Aliases[0] = "changed"
			}
		}
		if after := pl.Sites(); !reflect.DeepEqual(after, before) {
			t.Fatalf("Sites changed by the caller's change: %v", after)
		}
		l := mustAttach(t, pl, c.CountEntry)
		defer l.Close()
		runTarget(t, target, 3)
		// The target calls func_i 3 + i%3 times.
		probetest.CheckCounts(t, pl.Sites(), c.Counts, map[string]uint64{"func_00000": 3, "func_00001": 4, "func_00002": 5, "func_00003": 3, "func_00004": 4})
	})

	t.Run("too many clones", func(t *testing.T) {
		noCookies := f
		noCookies.UprobeMulti, noCookies.UprobeMultiPIDFilter, noCookies.UprobeSession, noCookies.Cookies = false, false, false, false
		big := testprogs.BuildTarget(t, 10_000)
		pl, err := multiprobe.Resolve(mustParse(t, "uprobe:"+big+":func_*"), &multiprobe.Options{Features: &noCookies})
		if err != nil {
			t.Fatal(err)
		}
		defer pl.Close()
		spec, err := testprogs.CounterSpec()
		if err != nil {
			t.Fatal(err)
		}
		if err := pl.Prepare(spec); !errors.Is(err, multiprobe.ErrTooManyClones) {
			t.Errorf("Prepare for 10,000 sites without cookies: %v, want ErrTooManyClones", err)
		}
	})

	t.Run("program of another kind", func(t *testing.T) {
		pl, err := multiprobe.Resolve(mustParse(t, "uprobe:"+target+":func_*"), &opts)
		if err != nil {
			t.Fatal(err)
		}
		defer pl.Close()
		socket, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SocketFilter, License: "GPL",
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}})
		if err != nil {
			t.Fatal(err)
		}
		defer socket.Close()
		closed, err := testprogs.LoadCounter(f.Path())
		if err != nil {
			t.Fatal(err)
		}
		closed.Close()
		for _, prog := range []*ebpf.Program{nil, socket, closed.CountEntry} {
			l, err := pl.Attach(prog)
			if err == nil {
				l.Close()
				t.Fatal("attached")
			}
			if !errors.Is(err, attach.ErrWrongProgram) {
				t.Errorf("%v: %v, want ErrWrongProgram", prog, err)
			}
		}
	})
}

// clonesChildEnv makes TestClonesLeaveNothing the child that runs with a
// low RLIMIT_NOFILE, which cannot be raised again without privileges the
// test should not spend.
const clonesChildEnv = "MULTIPROBE_CLONES_CHILD"

// TestClonesLeaveNothing fails an attach on a kernel without BPF cookies
// after the entry sites are attached, each with its clone: RLIMIT_NOFILE
// leaves room for them but not for the return sites that follow. The attach must fail whole with ErrFDBudget (refused up
// front by each step, rather than EMFILE part way) and leave no program,
// map, link or descriptor behind.
func TestClonesLeaveNothing(t *testing.T) {
	f := paths(t)[0]
	if os.Getenv(clonesChildEnv) == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestClonesLeaveNothing$", "-test.v")
		cmd.Env = append(os.Environ(), clonesChildEnv+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestClonesLeaveNothing") {
			t.Errorf("child: %v\n%s", err, out)
		}
		return
	}
	const n = 20
	noCookies := f
	noCookies.UprobeMulti, noCookies.UprobeMultiPIDFilter, noCookies.UprobeSession, noCookies.Cookies = false, false, false, false
	target := testprogs.PrivateTarget(t, n)
	cnt, plans := setup(t, noCookies, multiprobe.Options{}, []string{"uprobe:" + target + ":func_*", "uretprobe:" + target + ":func_*"})
	before := probetest.TakeSnapshot(t, cnt.CountEntry)
	// Room for 4n more descriptors and the slack fds.Ensure asks for
	// when the clones are made (each and its BTF, then a perf event and
	// a link per site); not for the return sites' after them.
	room := uint64(before.FDs + 4*n + 64 + n)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: room, Max: room}); err != nil {
		t.Fatal(err)
	}
	l, err := plans[0].Attach(cnt.CountEntry)
	if err == nil {
		l.Close()
		t.Fatal("attached the return sites without room for them")
	}
	t.Log(err)
	if !errors.Is(err, fallback.ErrFDBudget) {
		t.Errorf("%v, want ErrFDBudget", err)
	}
	before.Check(t, "after the failed attach")
}

func testNotPrepared(t *testing.T, f kernelprobe.Features, target string, forPath bool, pids []int) {
	pl, err := multiprobe.Resolve(mustParse(t, "uprobe:"+target+":func_*"), &multiprobe.Options{Features: &f, PIDs: pids})
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Close()
	var c *testprogs.Counter
	if forPath {
		c, err = testprogs.LoadCounter(f.Path())
	} else {
		var spec *ebpf.CollectionSpec
		if spec, err = testprogs.CounterSpec(); err == nil {
			c, err = testprogs.NewCounter(spec)
		}
		if !f.Cookies {
			// A kernel without BPF cookies (5.10; paths forces only
			// the fallback, never cookies off) has no
			// bpf_get_attach_cookie: the verifier refuses the spec
			// before Attach can say anything.
			if err == nil {
				c.Close()
				t.Fatal("loaded a program that calls bpf_get_attach_cookie on a kernel without it")
			}
			return
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := pl.Attach(c.CountEntry)
	// A perf-event uprobe takes a program of any attach type, and a
	// kernel with cookies needs no clones: there, only a pid set needs
	// the plan's Prepare.
	needed := pids != nil || !f.Cookies || (!forPath && f.Path() == kernelprobe.PathUprobeMulti)
	if err == nil {
		l.Close()
		if needed {
			t.Fatal("attached")
		}
		return
	}
	msg := err.Error()
	if !strings.Contains(msg, "plan.Prepare(spec)") || strings.Contains(msg, "\n") || strings.Contains(msg, "give the plan Options.PIDs") {
		t.Errorf("%v\nwant one line that says to call plan.Prepare(spec)", err)
	}
	if pids != nil && (!errors.Is(err, multiprobe.ErrNotPrepared) || !errors.Is(err, multiprobe.ErrNoPIDFilter)) {
		t.Errorf("%v, want ErrNotPrepared and ErrNoPIDFilter", err)
	}
	t.Log(err)
}
