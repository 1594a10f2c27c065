package usdt

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/probetest"
)

// headerUser is a BPF program using every part of bpf/mp_usdt.bpf.h and bpf/mp_pids.bpf.h. PRELUDE
// is replaced by what a user might include first.
const headerUser = `PRELUDE
#include "mp_usdt.bpf.h"
#include "mp_pids.bpf.h"

__attribute__((section("uprobe.multi"), used))
int MP_USDT(all_types, char c, unsigned short u16, int i, long l, const char *p, void *q,
	    long a7, long a8, long a9, long a10, long a11, long a12)
{
	long v;
	int n = mp_usdt_arg_cnt(ctx);

	if (mp_usdt_arg(ctx, 11, &v) == 0 && mp_usdt_arg_size(ctx, 11) == 8)
		n += v;
	return n + c + u16 + i + l + (long)p + (long)q + mp_usdt_cookie(ctx);
}

__attribute__((section("uprobe.multi"), used))
int MP_USDT(no_args)
{
	return 0;
}

char LICENSE[] __attribute__((section("license"), used)) = "GPL";
`

// TestHeaderCompiles builds a program using the header with clang-19 for
// the BPF target, -Wall -Werror, for each architecture and byte order, with
// no include path but the header's directory, and next to libbpf's headers
// and a vmlinux.h.
func TestHeaderCompiles(t *testing.T) {
	clang, err := exec.LookPath("clang-19")
	testutil.RequireTool(t, "clang-19", err)
	bpfDir, _ := filepath.Abs("../bpf")
	dir := t.TempDir()

	multiarch, _ := exec.Command("gcc", "-print-multiarch").Output()
	vmlinux := ""
	if bpftool, err := exec.LookPath("bpftool"); err == nil {
		out, err := exec.Command(bpftool, "btf", "dump", "file", "/sys/kernel/btf/vmlinux", "format", "c").Output()
		if err == nil {
			vmlinux = filepath.Join(dir, "vmlinux.h")
			if err := os.WriteFile(vmlinux, out, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}

	for _, c := range []struct {
		name, target, arch, prelude string
		flags                       []string
	}{
		{"x86", "bpfel", "x86", "", nil},
		{"arm64", "bpfel", "arm64", "", nil},
		{"riscv", "bpfel", "riscv", "", nil},
		{"s390", "bpfeb", "s390", "", nil},
		{"powerpc", "bpfel", "powerpc", "", nil},
		{"no arch", "bpfel", "", "", nil},
		{"libbpf", "bpfel", "x86", "#include <linux/bpf.h>\n#include <bpf/bpf_helpers.h>\n#include <bpf/bpf_tracing.h>",
			[]string{"-I/usr/include/" + strings.TrimSpace(string(multiarch))}},
		{"vmlinux", "bpfel", "x86", "#include \"vmlinux.h\"\n#include <bpf/bpf_helpers.h>", []string{"-I" + dir}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.name == "vmlinux" && vmlinux == "" {
				probetest.Unavailable(t, "no bpftool or kernel BTF to make vmlinux.h (.ci/install-deps installs bpftool)")
			}
			src := filepath.Join(dir, "prog.c")
			if err := os.WriteFile(src, []byte(strings.Replace(headerUser, "PRELUDE", c.prelude, 1)), 0o644); err != nil {
				t.Fatal(err)
			}
			args := []string{"-O2", "-g", "-Wall", "-Werror", "-target", c.target, "-I" + bpfDir, "-c", src, "-o", filepath.Join(dir, "prog.o")}
			if c.arch != "" {
				args = append(args, "-D__TARGET_ARCH_"+c.arch)
			}
			args = append(args, c.flags...)
			if out, err := exec.Command(clang, args...).CombinedOutput(); err != nil {
				t.Fatalf("clang-19 %s: %v\n%s", strings.Join(args, " "), err, out)
			}
			if c.name == "x86" && runtime.GOARCH == "amd64" {
				// The twelve-argument handler must also pass the verifier.
				probetest.RequireBPF(t)
				cs, err := ebpf.LoadCollectionSpec(filepath.Join(dir, "prog.o"))
				if err != nil {
					t.Fatal(err)
				}
				coll, err := ebpf.NewCollection(cs)
				if err != nil {
					t.Fatalf("verifier: %+v", err)
				}
				coll.Close()
			}
		})
	}
}
