package testprogs

import (
	"bufio"
	"bytes"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Root makes a directory to chroot a dynamically linked program into, as
// a container's root: a copy of target at the path at, and copies of its
// loader (PT_INTERP) and of the libraries the loader finds for it at
// their own paths. Copies, so that the root's files are inodes of its
// own. The libraries are those LD_TRACE_LOADED_OBJECTS lists, as ldd
// asks the loader, so that no ldd (a shell script the test VMs lack) is
// needed.
func Root(tb testing.TB, target, at string) string {
	tb.Helper()
	ef, err := elf.Open(target)
	if err != nil {
		tb.Fatal(err)
	}
	var interp string
	for _, p := range ef.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err != nil {
				tb.Fatal(err)
			}
			interp = string(bytes.TrimRight(b, "\x00"))
		}
	}
	ef.Close()
	if interp == "" {
		tb.Fatalf("%s has no PT_INTERP: not a dynamically linked program", target)
	}
	cmd := exec.Command(interp, target)
	cmd.Env = []string{"LD_TRACE_LOADED_OBJECTS=1"}
	out, err := cmd.Output()
	if err != nil {
		tb.Fatalf("%s listing %s's libraries: %v", interp, target, err)
	}
	files := map[string]string{target: at, interp: interp}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		// "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)", or
		// "/lib64/ld-linux-x86-64.so.2 (0x...)".
		f := strings.Fields(sc.Text())
		if i := slices.Index(f, "=>"); i >= 0 && i+1 < len(f) {
			f = f[i+1:]
		}
		if len(f) > 0 && strings.HasPrefix(f[0], "/") {
			files[f[0]] = f[0]
		}
	}
	root := tb.TempDir()
	for src, dst := range files {
		data, err := os.ReadFile(src)
		if err != nil {
			tb.Fatal(err)
		}
		dst = filepath.Join(root, dst)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(dst, data, 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	return root
}
