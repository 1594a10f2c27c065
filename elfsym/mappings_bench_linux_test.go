package elfsym

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// BenchmarkExecutableMappings reads the mappings of a process that maps
// 1,000 files executable, as a watcher does at each mmap event: all of
// them with their HostPaths (ExecutableMappings), or only the one the
// event names (ExecutableMappingsIf keeping one start), side by side.
func BenchmarkExecutableMappings(b *testing.B) {
	py, err := exec.LookPath("python3")
	if err != nil {
		b.Skip("needs python3")
	}
	dir := b.TempDir()
	for i := range 1000 {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("lib%04d.so", i)), make([]byte, 4096), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	cmd := exec.Command(py, "-S", "-c", `import mmap, os, sys
maps = []
for name in sorted(os.listdir(sys.argv[1])):
    fd = os.open(os.path.join(sys.argv[1], name), os.O_RDONLY)
    maps.append(mmap.mmap(fd, 0, prot=mmap.PROT_READ | mmap.PROT_EXEC))
    os.close(fd)
print("ready", flush=True)
sys.stdin.readline()`, dir)
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { in.Close(); cmd.Wait() }()
	if line, _ := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
		b.Fatalf("python said %q", line)
	}
	pid := cmd.Process.Pid
	all, err := ExecutableMappings(pid)
	if err != nil {
		b.Fatal(err)
	}
	var last Mapping
	n := 0
	for _, m := range all {
		if strings.HasPrefix(m.Path, dir) {
			last, n = m, n+1
		}
	}
	if n != 1000 {
		b.Fatalf("%d of the 1,000 files mapped", n)
	}
	b.Run("all", func(b *testing.B) {
		for b.Loop() {
			if _, err := ExecutableMappings(pid); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("one", func(b *testing.B) {
		for b.Loop() {
			ms, err := ExecutableMappingsIf(pid, func(m Mapping) bool { return m.Start == last.Start })
			if err != nil || len(ms) != 1 || ms[0].HostPath == "" {
				b.Fatalf("%v, %v", ms, err)
			}
		}
	})
}
