package watch

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/internal/fds"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/kernelprobe"
)

// injectEvent writes a record of n zero bytes into the watch's ring
// buffer, as a kernel program would, through a socket filter run once.
func injectEvent(t *testing.T, w *Watch, n int32) {
	t.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: ebpf.SocketFilter, License: "GPL",
		Instructions: asm.Instructions{
			asm.Mov.Imm(asm.R1, 0),
			asm.StoreMem(asm.RFP, -16, asm.R1, asm.DWord),
			asm.StoreMem(asm.RFP, -8, asm.R1, asm.DWord),
			asm.LoadMapPtr(asm.R1, w.src.objs.Events.FD()),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, -16),
			asm.Mov.Imm(asm.R3, n),
			asm.Mov.Imm(asm.R4, 0),
			asm.FnRingbufOutput.Call(),
			asm.Mov.Imm(asm.R0, 0),
			asm.Return(),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	if _, err := prog.Run(&ebpf.RunOptions{Data: make([]byte, 14)}); err != nil {
		t.Fatal(err)
	}
}

// reports collects a Watch's reports.
type reports struct {
	mu  sync.Mutex
	all []Report
}

func (r *reports) add(rep Report) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.all = append(r.all, rep)
}

// count is how many reports say what.
func (r *reports) count(what What) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := 0
	for _, rep := range r.all {
		if rep.What == what {
			k++
		}
	}
	return k
}

// reportingWatch starts a Watch of the counter on spec, on this kernel's
// path, that collects its reports; it is closed at the end of the test.
func reportingWatch(t *testing.T, spec string) (*Watch, *testprogs.Counter, *reports) {
	t.Helper()
	f, err := kernelprobe.Detect()
	if err != nil {
		t.Fatal(err)
	}
	cs, c := loadCounter(t, f)
	probes, err := multiprobe.ParseProbes(spec)
	if err != nil {
		t.Fatal(err)
	}
	got := &reports{}
	w, err := New(probes, cs, c.CountEntry, &Options{Plan: multiprobe.Options{Features: &f}, Report: got.add})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w, c, got
}

// wait returns the first report for which ok is true, waiting up to 10 s.
func (r *reports) wait(t *testing.T, what string, ok func(Report) bool) Report {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		r.mu.Lock()
		for _, rep := range r.all {
			if ok(rep) {
				r.mu.Unlock()
				return rep
			}
		}
		r.mu.Unlock()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	last := r.all[max(len(r.all)-10, 0):]
	t.Fatalf("no report of %s in 10 s; %d reports, the last %d: %+v", what, len(r.all), len(last), last)
	return Report{}
}

// TestWatchMalformedEvent: a record the watch cannot read (8 bytes, of the
// 16 an event has) is reported, with a rescan of /proc, and the watch goes
// on: a file that appears afterwards is attached and every call counted.
// Before, the event loop returned at the record: nothing was attached
// after it, and Close said nothing. Close may be called twice.
func TestWatchMalformedEvent(t *testing.T) {
	requireEvents(t)
	const n, calls = 5, 3
	dir := t.TempDir()
	w, c, got := reportingWatch(t, "uprobe:"+dir+"/*:func_*")
	injectEvent(t, w, 8)
	rep := got.wait(t, "the malformed event", func(r Report) bool { return r.What == Rescanned })
	if rep.Err == nil {
		t.Error("Rescanned report without its error")
	}

	target := filepath.Join(dir, "after")
	data, err := os.ReadFile(testprogs.BuildTarget(t, n))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(target, data, 0o755); err != nil {
		t.Fatal(err)
	}
	// Run until attached: the watch attaches a file a millisecond or so
	// after its process maps it, and calls before that are not counted.
	for runs := 0; ; runs++ {
		if files := w.Files(); len(files) == 1 {
			c.Counts.Update(uint32(0), uint64(0), ebpf.UpdateAny) // from here on
			for i := range uint32(n) {
				c.Counts.Update(i, uint64(0), ebpf.UpdateAny)
			}
			break
		}
		if runs == 1000 {
			t.Fatalf("%s not attached after the malformed event: %+v", target, got.all)
		}
		if out, err := exec.Command(target, "1").CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", target, err, out)
		}
	}
	if out, err := exec.Command(target, fmt.Sprint(calls)).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", target, err, out)
	}
	checkCounts(t, c, n, calls, 1)

	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
}

// TestAttachFIFO: a file a process mapped and then replaced by a FIFO at
// its path (an unprivileged user can) is skipped at once, with
// fds.ErrNotRegular: os.Open there blocked until a writer came, holding
// the watch's lock, and the watch hung for good.
func TestAttachFIFO(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "lib.so")
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	probes, err := multiprobe.ParseProbes("uprobe:" + fifo + ":f")
	if err != nil {
		t.Fatal(err)
	}
	w := &Watch{probes: probes, targets: [][]string{{fifo}}, builds: map[string]*build{}, bases: map[string]uint64{}}
	done := make(chan error, 1)
	go func() {
		_, err := w.attach(&job{f: &tracked{}, path: fifo, hostPath: fifo})
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, fds.ErrNotRegular) {
			t.Errorf("attach of a FIFO: %v, want ErrNotRegular", err)
		}
	case <-time.After(5 * time.Second):
		// Let the open return, so the test ends.
		if wr, err := os.OpenFile(fifo, os.O_WRONLY, 0); err == nil {
			wr.Close()
		}
		t.Fatal("attach of a FIFO blocked")
	}
}

// TestWatchFailedOnce: a file that matches a target but cannot be
// attached (not an ELF file), mapped by one process 20 times and by 10
// more processes, is tried once and reported Skipped once, not resolved
// again at every mapping; written over in place with a program that has
// the symbol, it is attached at its next mapping and counted exactly.
// Before, every mapping resolved it again and said so.
func TestWatchFailedOnce(t *testing.T) {
	requireEvents(t)
	py, err := exec.LookPath("python3")
	testutil.RequireTool(t, "python3", err)
	const n, calls = 5, 3
	path := filepath.Join(t.TempDir(), "lib.so")
	if err := os.WriteFile(path, make([]byte, 8192), 0o755); err != nil {
		t.Fatal(err)
	}
	w, c, got := reportingWatch(t, "uprobe:"+path+":func_*")
	mapper := `import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
maps = [mmap.mmap(fd, 0, prot=mmap.PROT_READ | mmap.PROT_EXEC) for _ in range(int(sys.argv[2]))]
print("ready", flush=True)
sys.stdin.readline()`
	holder := testprogs.Start(t, py, "-S", "-c", mapper, path, "20")
	for range 10 {
		testprogs.Start(t, py, "-S", "-c", mapper, path, "1").Finish(t)
	}
	skipped := func() int {
		got.mu.Lock()
		defer got.mu.Unlock()
		k := 0
		for _, r := range got.all {
			if r.What == Skipped && r.Path == path {
				k++
			}
		}
		return k
	}
	got.wait(t, "the file skipped", func(r Report) bool { return r.What == Skipped })
	w.mu.Lock()
	tries := -1
	for _, fl := range w.failures {
		tries = fl.tries
	}
	w.mu.Unlock()
	// Tried again only after its backoff (1 s, 2 s, ...) while mapped.
	if k := skipped(); k != 1 || tries > 2 {
		t.Errorf("a file that failed, mapped by 11 processes: %d Skipped reports, tried again %d times; want 1 report and a retry a backoff", k, tries)
	}

	// In place: the same inode, another content.
	data, err := os.ReadFile(testprogs.BuildTarget(t, n))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o755); err != nil {
		t.Fatal(err)
	}
	p := testprogs.Start(t, path, "-wait", fmt.Sprint(calls))
	got.wait(t, "the file attached once changed", func(r Report) bool { return r.What == Attached && r.Path == path })
	p.Finish(t)
	holder.Finish(t)
	checkCounts(t, c, n, calls, 1)
}

// TestWatchPinDirNotBPF: New refuses a PinDir that is not on a BPF
// filesystem, at once. Before, it started and then skipped every file
// ("not on a BPF filesystem" at each Pin).
func TestWatchPinDirNotBPF(t *testing.T) {
	requireEvents(t)
	f, err := kernelprobe.Detect()
	if err != nil {
		t.Fatal(err)
	}
	spec, c := loadCounter(t, f)
	probes, err := multiprobe.ParseProbes("uprobe:libc.so.6:malloc")
	if err != nil {
		t.Fatal(err)
	}
	w, err := New(probes, spec, c.CountEntry, &Options{Plan: multiprobe.Options{Features: &f}, PinDir: filepath.Join(t.TempDir(), "pins")})
	if err == nil {
		w.Close()
		t.Fatal("New with a PinDir on no BPF filesystem: no error")
	}
	if !errors.Is(err, unix.EINVAL) {
		t.Errorf("New with a PinDir on no BPF filesystem: %v, want EINVAL", err)
	}
}

// TestWatchBudget: 1,500 copies of a matching program mapped by nobody,
// the watch at the budget of an agent at RLIMIT_NOFILE 2048 (1,024 file
// descriptors): nobody's copies take at most their share (an eighth),
// each is said Skipped at most once (ErrBudget), and root's own file,
// mapped after them, is attached in its usual time and every call
// counted. Before, 667 copies were attached, then no fd was left, 46k to
// 99k Skipped reports came in 30 s, and the legitimate file had no report
// in 10 s.
func TestWatchBudget(t *testing.T) {
	requireEvents(t)
	py, err := exec.LookPath("python3")
	testutil.RequireTool(t, "python3", err)
	const n, calls, copies, maxFDs = 5, 3, 1500, 1024
	dir := t.TempDir()
	for d := dir; d != "/tmp" && d != "/"; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil { // nobody maps from here
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(testprogs.BuildTarget(t, n))
	if err != nil {
		t.Fatal(err)
	}
	hostile := filepath.Join(dir, "hostile")
	if err := os.Mkdir(hostile, 0o755); err != nil {
		t.Fatal(err)
	}
	// By a bare name, as "libc" is: a glob in this root would be mapped
	// by the watch itself (see seed), root's files from the start.
	for i := range copies {
		if err := os.WriteFile(filepath.Join(hostile, fmt.Sprintf("libmpbudget.so.%d", i)), data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	legit := filepath.Join(dir, "libmpbudget.so.legit")
	if err := os.WriteFile(legit, data, 0o755); err != nil {
		t.Fatal(err)
	}

	f, err := kernelprobe.Detect()
	if err != nil {
		t.Fatal(err)
	}
	cs, c := loadCounter(t, f)
	probes, err := multiprobe.ParseProbes("uprobe:libmpbudget:func_*")
	if err != nil {
		t.Fatal(err)
	}
	got := &reports{}
	fdsBefore := openFDs(t)
	w, err := New(probes, cs, c.CountEntry, &Options{Plan: multiprobe.Options{Features: &f}, Report: got.add, MaxFDs: maxFDs})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()

	mapper := `import mmap, os, sys
os.setgid(65534); os.setuid(65534)
maps = []
for name in sorted(os.listdir(sys.argv[1])):
    fd = os.open(os.path.join(sys.argv[1], name), os.O_RDONLY)
    maps.append(mmap.mmap(fd, 0, prot=mmap.PROT_READ | mmap.PROT_EXEC))
    os.close(fd)
print("ready", flush=True)
sys.stdin.readline()`
	holder := testprogs.Start(t, py, "-S", "-c", mapper, hostile)
	count := func(ok func(Report) bool) int {
		got.mu.Lock()
		defer got.mu.Unlock()
		k := 0
		for _, r := range got.all {
			if ok(r) {
				k++
			}
		}
		return k
	}
	over := func(r Report) bool { return r.What == Skipped && errors.Is(r.Err, ErrBudget) }
	got.wait(t, "a copy over nobody's budget", over)

	start := time.Now()
	p := testprogs.Start(t, legit, "-wait", fmt.Sprint(calls))
	got.wait(t, "root's own file attached", func(r Report) bool { return r.What == Attached && r.Path == legit })
	took := time.Since(start)
	p.Finish(t)
	checkCounts(t, c, n, calls, 1)

	time.Sleep(time.Second) // what the copies do meanwhile
	hostileFiles := 0
	for _, f := range w.Files() {
		if filepath.Dir(f.Path) == hostile {
			hostileFiles++
		}
	}
	skipped := got.count(Skipped)
	fds := openFDs(t) - fdsBefore
	t.Logf("%d copies by nobody: %d attached, %d Skipped reports (%d over budget); root's file attached %v after it started; +%d fds",
		copies, hostileFiles, skipped, count(over), took.Round(time.Millisecond), fds)
	if hostileFiles == 0 || hostileFiles*3 > maxFDs/shareDiv {
		t.Errorf("nobody's copies attached: %d, want some, and at most an eighth of %d fds (3 each)", hostileFiles, maxFDs)
	}
	if skipped > copies {
		t.Errorf("%d Skipped reports for %d copies: want each said at most once", skipped, copies)
	}
	if fds > maxFDs {
		t.Errorf("the watch holds %d more fds than before, past its budget of %d", fds, maxFDs)
	}
	if took > 5*time.Second {
		t.Errorf("root's file attached %v after it started, beside nobody's copies", took)
	}
	holder.Finish(t)
}

// openFDs is how many files this process has open.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestWatchSlowFile: a file whose attach takes long (held in its worker
// here, as a 100 MB binary or a slow kernel would) holds back neither
// another file mapped after it, attached and counted meanwhile, nor
// Files, which does not list it until it is attached. Before, the attach
// ran on the event goroutine under the watch's lock: the other file, and
// Files, waited for it.
func TestWatchSlowFile(t *testing.T) {
	requireEvents(t)
	const n, calls = 5, 3
	data, err := os.ReadFile(testprogs.BuildTarget(t, n))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	slow, fast := filepath.Join(dir, "libmpslow.so.1"), filepath.Join(dir, "libmpslow.so.2")
	for _, p := range []string{slow, fast} {
		if err := os.WriteFile(p, data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	hold, held := make(chan struct{}), make(chan struct{})
	testAttaching = func(path string) {
		if path == slow {
			close(held)
			<-hold
		}
	}
	t.Cleanup(func() { testAttaching = nil }) // after the watch's Close
	w, c, got := reportingWatch(t, "uprobe:libmpslow:func_*")
	release := sync.OnceFunc(func() { close(hold) })
	defer release()

	ps := testprogs.Start(t, slow, "-wait", fmt.Sprint(calls))
	<-held
	pf := testprogs.Start(t, fast, "-wait", fmt.Sprint(calls))
	got.wait(t, "the other file attached", func(r Report) bool { return r.What == Attached && r.Path == fast })
	files := make(chan []File, 1)
	go func() { files <- w.Files() }()
	select {
	case fs := <-files:
		if len(fs) != 1 || fs[0].Path != fast {
			t.Errorf("Files while one is being attached: %+v, want only %s", fs, fast)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Files waited for a file being attached")
	}
	pf.Finish(t)
	checkCounts(t, c, n, calls, 1)

	release()
	got.wait(t, "the slow file attached", func(r Report) bool { return r.What == Attached && r.Path == slow })
	ps.Finish(t)
	// Its calls come after its attach: -wait waits for a line first.
	checkCounts(t, c, n, calls, 2)
}

// TestWatchConcurrent: Files, Unpin and Close from several goroutines while
// files are being attached and detached (run with -race): Close called
// twice at once, Files after it empty, and no pin left behind.
func TestWatchConcurrent(t *testing.T) {
	requireEvents(t)
	const n, copies = 5, 6
	data, err := os.ReadFile(testprogs.BuildTarget(t, n))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	f, err := kernelprobe.Detect()
	if err != nil {
		t.Fatal(err)
	}
	cs, c := loadCounter(t, f)
	probes, err := multiprobe.ParseProbes("uprobe:libmpconc:func_*")
	if err != nil {
		t.Fatal(err)
	}
	// Pinned where links can be (BPF perf links came with cookies, 5.15).
	pins := ""
	if f.Cookies || f.Path() == kernelprobe.PathUprobeMulti {
		pins = filepath.Join(testutil.BPFFS(t), "watch")
	}
	got := &reports{}
	w, err := New(probes, cs, c.CountEntry, &Options{Plan: multiprobe.Options{Features: &f}, PinDir: pins, Report: got.add})
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			path := filepath.Join(dir, fmt.Sprintf("libmpconc.so.%d", i%copies))
			os.Remove(path) // a new file each time: attached, then detached
			if err := os.WriteFile(path, data, 0o755); err != nil {
				t.Error(err)
				return
			}
			testprogs.Start(t, path, "-wait", "1").Finish(t)
		}
	})
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				for _, f := range w.Files() {
					_ = f.Link.Sites()
					_ = f.Link.NumFDs()
				}
			}
		})
	}
	// By files, not time: an emulated guest attaches a few a second.
	waitFor := func(what What, k int) {
		for deadline := time.Now().Add(30 * time.Second); got.count(what) < k; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d files %v in 30 s, want %d", got.count(what), what, k)
			}
		}
	}
	waitFor(Attached, 3)
	if err := w.Unpin(); err != nil {
		t.Errorf("Unpin: %v", err)
	}
	waitFor(Attached, got.count(Attached)+2)
	// A copy is detached once the loop comes back to it (copies files
	// on): in a guest that takes longer than the attaches above.
	waitFor(Detached, 1)
	var closers sync.WaitGroup
	for range 2 {
		closers.Go(func() {
			if err := w.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
	}
	closers.Wait()
	close(stop)
	wg.Wait()
	if files := w.Files(); len(files) != 0 {
		t.Errorf("Files after Close: %+v", files)
	}
	attached, detached := got.count(Attached), got.count(Detached)
	t.Logf("%d files attached, %d detached meanwhile", attached, detached)
	if attached < 2 || detached == 0 {
		t.Errorf("%d files attached, %d detached: the test did not exercise the watch", attached, detached)
	}
	if ents, _ := os.ReadDir(pins); pins != "" && len(ents) != 0 {
		t.Errorf("pins left after Unpin and Close: %v", ents)
	}
}
