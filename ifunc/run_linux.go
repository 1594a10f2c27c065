//go:build linux

package ifunc

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// run sets the tracee's registers, lets it run until it faults returning
// to address 0, and reads the result.
func run(pid int, regs *unix.PtraceRegs, read func(*unix.PtraceRegs) (pc, result uint64)) (uint64, error) {
	if err := unix.PtraceSetRegs(pid, regs); err != nil {
		return 0, err
	}
	if err := unix.PtraceCont(pid, 0); err != nil {
		return 0, err
	}
	if err := waitStop(pid, unix.SIGSEGV); err != nil {
		return 0, err
	}
	var got unix.PtraceRegs
	if err := unix.PtraceGetRegs(pid, &got); err != nil {
		return 0, err
	}
	pc, result := read(&got)
	if pc != 0 {
		return 0, fmt.Errorf("faulted at %#x, not on returning", pc)
	}
	return result, nil
}

// runResolvers starts helper under ptrace with the library f preloaded,
// runs it to its entry point and calls each resolver there.
func runResolvers(path string, f *os.File, ef *elf.File, helper string, id fileID, resolvers []uint64) (out []uint64, whys []error, err error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, nil, fmt.Errorf("ifunc: %s: %w", path, err)
	}
	// ptrace requests must come from the thread that started the tracee.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cmd := exec.Command(helper)
	// The helper loads the very file f is, through the descriptor it
	// inherits as fd 3: a file swapped in at path since cannot be run
	// with the owner's rights that were checked (helperCredential).
	cmd.ExtraFiles = []*os.File{f}
	cmd.Env = []string{"LD_PRELOAD=/proc/self/fd/3", "PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Ptrace: true, Pdeathsig: syscall.SIGKILL, Credential: helperCredential(&st)}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("ifunc: starting %s: %w", helper, err)
	}
	pid := cmd.Process.Pid
	defer func() {
		unix.Kill(pid, unix.SIGKILL)
		var ws unix.WaitStatus
		unix.Wait4(pid, &ws, 0, nil)
		// The Process holds a pidfd, which only Wait or Release close
		// now: left to the garbage collector, it would close at some
		// later moment, under a caller counting its descriptors.
		cmd.Process.Release()
	}()
	if err := waitStop(pid, unix.SIGTRAP); err != nil { // the exec
		return nil, nil, fmt.Errorf("ifunc: %s: %w", helper, err)
	}
	if err := runToEntry(pid); err != nil {
		return nil, nil, fmt.Errorf("ifunc: %s with %s preloaded: %w", helper, path, err)
	}
	bias, lo, hi, err := loadBias(pid, id, ef)
	if errors.Is(err, errNotMapped) {
		err = errors.New("not mapped by the helper: the loader did not preload it (is it readable by all?)")
	}
	if err != nil {
		return nil, nil, fmt.Errorf("ifunc: %s in %s: %w", path, helper, err)
	}
	hwcap, _ := auxv(pid, atHWCap)
	var saved unix.PtraceRegs
	if err := unix.PtraceGetRegs(pid, &saved); err != nil {
		return nil, nil, fmt.Errorf("ifunc: %w", err)
	}
	out, whys = make([]uint64, len(resolvers)), make([]error, len(resolvers))
	for i, r := range resolvers {
		got, err := call(pid, &saved, bias+r, hwcap)
		switch {
		case err != nil:
			return nil, nil, fmt.Errorf("ifunc: %s: calling the resolver at %#x: %w", path, r, err)
		case got < lo || got >= hi:
			// gettimeofday's, for one, picks the vDSO's, which no
			// uprobe reaches: it is no file's code.
			whys[i] = fmt.Errorf("ifunc: %s: the resolver at %#x returned %#x, in %s, not in the library", path, r, got, mappingAt(pid, got))
		default:
			out[i] = got - bias
		}
	}
	return out, whys, nil
}

// waitStop waits for the tracee to stop with sig.
func waitStop(pid int, sig unix.Signal) error {
	var ws unix.WaitStatus
	if _, err := unix.Wait4(pid, &ws, 0, nil); err != nil {
		return err
	}
	switch {
	case ws.Stopped() && ws.StopSignal() == sig:
		return nil
	case ws.Stopped():
		return fmt.Errorf("stopped by %v, want %v", ws.StopSignal(), sig)
	case ws.Exited():
		return fmt.Errorf("exited with status %d (does the library load? run it with LD_PRELOAD to see)", ws.ExitStatus())
	case ws.Signaled():
		return fmt.Errorf("killed by %v", ws.Signal())
	}
	return fmt.Errorf("wait status %#x", ws)
}

// runToEntry runs the tracee to its program's entry point: by then the
// loader has mapped and relocated every library, which is what the
// resolvers read (the CPU features it detected, their GOTs).
func runToEntry(pid int) error {
	entry, err := auxv(pid, atEntry)
	if err != nil {
		return err
	}
	var orig [8]byte
	if _, err := unix.PtracePeekData(pid, uintptr(entry), orig[:]); err != nil {
		return fmt.Errorf("reading the entry point %#x: %w", entry, err)
	}
	bp := orig
	copy(bp[:], breakpoint)
	if _, err := unix.PtracePokeData(pid, uintptr(entry), bp[:]); err != nil {
		return fmt.Errorf("setting a breakpoint at %#x: %w", entry, err)
	}
	if err := unix.PtraceCont(pid, 0); err != nil {
		return err
	}
	if err := waitStop(pid, unix.SIGTRAP); err != nil {
		return err
	}
	_, err = unix.PtracePokeData(pid, uintptr(entry), orig[:])
	return err
}
