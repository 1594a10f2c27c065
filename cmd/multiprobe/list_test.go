package main

import (
	"bytes"
	"debug/elf"
	"encoding/json"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/multiprobe/multiprobe/elfsym"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/probetest"
)

func TestList(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		code     int
		contains string
	}{
		{"table", []string{"list", "libc.so.6", "malloc", "strlen"}, 0, "IFUNC"},
		{"ifunc", []string{"list", "libc.so.6", "strlen"}, 0, "IFUNC's implementation on this machine (resolver at "},
		{"no args", []string{"list"}, 2, "need probe specs"},
		{"target alone", []string{"list", "libc.so.6"}, 0, "__libc_start_main"},
		{"kernel probe", []string{"list", "kprobe:do_sys_open"}, 2, "kprobe probes the kernel"},
		{"spec", []string{"list", "uprobe:libc.so.6:malloc"}, 0, "1 site in /"},
		{"bare lib name", []string{"list", "uprobe:libc:malloc"}, 0, "libc.so.6\n"},
		{"two specs", []string{"list", "uprobe:libc:malloc", "uprobe:libc:free"}, 0, "2 sites in 1 file"},
		{"specs of each kind", []string{"list", "u:libc:malloc", "ur:libc:free"}, 0, "(uretprobe):"},
		{"bad spec", []string{"list", "uprobe:libc.so.6"}, 2, "missing the function pattern"},
		{"usdt spec, no match", []string{"list", "usdt:libc.so.6:nope:nope"}, 1, "no matching USDT probes"},
		{"-p self", []string{"list", "-p", strconv.Itoa(os.Getpid()), "runtime.main"}, 0, "runtime.main"}, // DEBUG
		{"--pid spec", []string{"list", "--pid", strconv.Itoa(os.Getpid()), "uprobe:libc.so.6:malloc"}, 0, "malloc"},
		{"-p missing", []string{"list", "-p", "999999999", "x"}, 1, "process 999999999"},
		{"-p no match", []string{"list", "-p", strconv.Itoa(os.Getpid()), "no_such_function_xyz"}, 1, "no function matches"},
		{"glob in the path", []string{"list", "uprobe:/usr/lib/*/libc.so*:malloc"}, 0, "1 site in /usr/lib/"},
		{"glob matching nothing", []string{"list", "uprobe:/nonexistent/*/lib.so:x"}, 1, "no file matches"},
		{"* without -p", []string{"list", "uprobe:*:malloc"}, 2, "give -p PID and no probe"},
		{"bad flag", []string{"list", "--nope", "/bin/sh", "x"}, 2, "unknown flag --nope"},
		{"no match", []string{"list", "libc.so.6", "no_such_function_xyz"}, 1, "no function matches"},
		{"missing file", []string{"list", "/nonexistent/bin", "x"}, 1, "/nonexistent/bin"},
		{"unknown command", []string{"frobnicate"}, 2, "unknown command"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(tt.args, &stdout, &stderr)
			if code != tt.code {
				t.Fatalf("exit %d, want %d; stderr: %s", code, tt.code, stderr.String())
			}
			out := stdout.String() + stderr.String()
			if !strings.Contains(out, tt.contains) {
				t.Errorf("output %q does not contain %q", out, tt.contains)
			}
			if tt.code == 2 && strings.Count(strings.TrimSpace(stderr.String()), "\n") != 0 {
				t.Errorf("usage error is not one line: %q", stderr.String())
			}
		})
	}
}

func TestUSDTForms(t *testing.T) {
	python := "/usr/bin/python3.11"
	if _, err := os.Stat(python); err != nil {
		testutil.RequireTool(t, "python3.11", err)
	}
	tests := []struct {
		name     string
		args     []string
		code     int
		contains string
	}{
		{"target", []string{"usdt", python, "python:line"}, 0, "1 probe in " + python},
		{"spec", []string{"usdt", "usdt:python3.11:python:line"}, 0, "1 probe in " + python},
		{"specs", []string{"usdt", "usdt:python3.11:python:line", "usdt:python3.11:python:gc__*"}, 0, "2 probes in " + python},
		{"not usdt", []string{"usdt", "uprobe:libc:malloc"}, 2, "not a usdt: probe"},
		{"typo", []string{"usdt", python, "python:lien"}, 1, "no matching USDT probes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, errOut, code := execCLI(t, tt.args...)
			if code != tt.code || !strings.Contains(out+errOut, tt.contains) {
				t.Errorf("exit %d (want %d), output lacks %q:\n%s%s", code, tt.code, tt.contains, out, errOut)
			}
		})
	}
	t.Run("-p", func(t *testing.T) {
		p := exec.Command(python, "-c", "import sys; sys.stdin.read()")
		in, err := p.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { in.Close(); p.Wait() }()
		// Until the interpreter has mapped its files, its maps are
		// incomplete.
		deadline := time.Now().Add(10 * time.Second)
		for {
			out, errOut, code := execCLI(t, "usdt", "-p", strconv.Itoa(p.Process.Pid), "python:function__entry")
			if code == 0 && strings.Contains(out, "1 probe in "+python) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("usdt -p: exit %d:\n%s%s", code, out, errOut)
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}

func TestListJSON(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"list", "--json", "libc.so.6", "malloc"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	var got struct {
		Path  string
		Sites []listedSite
	}
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Sites) != 1 || got.Sites[0].Name != "malloc" || got.Sites[0].Offset == 0 || got.Sites[0].Type != "FUNC" ||
		got.Sites[0].Kind != "uprobe" || got.Sites[0].Path != got.Path {
		t.Errorf("JSON = %+v", got)
	}
	// Several specs: each site says its file and kind; no top-level path.
	stdout.Reset()
	if code := run([]string{"list", "--json", "u:libc.so.6:malloc", "ur:/bin/bash:sh_setlinebuf"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	got.Path, got.Sites = "", nil
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got.Path != "" || len(got.Sites) != 2 || got.Sites[1].Kind != "uretprobe" || got.Sites[1].Path != "/bin/bash" {
		t.Errorf("JSON = %+v", got)
	}
}

// TestPrivateMountNamespace lists, and counts, a program run in a mount
// namespace of its own from a directory bind-mounted there only: list -p
// and usdt -p find its file, and count -p takes the path it sees.
func TestPrivateMountNamespace(t *testing.T) {
	probetest.RequireBPF(t)
	p, inside := testprogs.StartInPrivateMount(t, testprogs.USDTTarget(t), "-wait", "5")
	pid := strconv.Itoa(p.PID())
	hostPath := "/proc/" + pid + "/root" + inside
	out, errOut, code := runCLI(t, "list", "-p", pid, "report")
	if code != 0 || !strings.Contains(out, hostPath) || errOut != "" {
		t.Errorf("list -p: exit %d, want %s listed\nstdout:\n%s\nstderr:\n%s", code, hostPath, out, errOut)
	}
	out, errOut, code = runCLI(t, "usdt", "-p", pid, "mp:tick")
	if code != 0 || !strings.Contains(out, "tick") {
		t.Errorf("usdt -p: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	for _, spec := range []string{"uprobe:" + inside + ":report", "usdt:" + inside + ":mp:tick"} {
		out, errOut, code = runCLI(t, "count", "-p", pid, "--duration", "0.1", spec)
		if code != 0 || !strings.Contains(out, "of 1 site") {
			t.Errorf("count -p %s: exit %d\nstdout:\n%s\nstderr:\n%s", spec, code, out, errOut)
		}
	}
}

// TestIFuncImplementationSize: an IFUNC site moved to its implementation
// shows the implementation's size, where a symbol covers it (libc6-dbg's
// debug file names glibc's implementations), not its resolver's.
func TestIFuncImplementationSize(t *testing.T) {
	out, errOut, code := runCLI(t, "list", "--json", "uprobe:libc.so.6:memcpy")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var l struct{ Sites []listedSite }
	if err := json.Unmarshal([]byte(out), &l); err != nil || len(l.Sites) != 1 {
		t.Fatalf("%v: %s", err, out)
	}
	s := l.Sites[0]
	f, err := elfsym.Open(s.Path)
	if err != nil {
		t.Fatal(err)
	}
	debug := f.DebugFile()
	f.Close()
	if s.Moved != elfsym.MovedIFunc.String() || debug == "" {
		t.Skipf("memcpy %s, debug file %q: nothing to check", s.Moved, debug)
	}
	ef, err := elf.Open(debug)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	syms, _ := ef.Symbols()
	lib, err := elf.Open(s.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer lib.Close()
	for _, sym := range syms {
		off, ok := uint64(0), false
		for _, p := range lib.Progs {
			if p.Type == elf.PT_LOAD && sym.Value >= p.Vaddr && sym.Value < p.Vaddr+p.Filesz {
				off, ok = sym.Value-p.Vaddr+p.Off, true
			}
		}
		if ok && elf.ST_TYPE(sym.Info) == elf.STT_FUNC && s.Offset >= off && s.Offset < off+sym.Size {
			if s.Size != sym.Size {
				t.Errorf("memcpy at %s's offset %#x: size %d, want %s's %d", sym.Name, s.Offset, s.Size, sym.Name, sym.Size)
			}
			return
		}
	}
	t.Errorf("no function of %s covers memcpy's implementation at %#x", debug, s.Offset)
}
