// Command vmrun runs a module's tests on other Linux kernels, each booted
// in QEMU: the newest Debian cloud kernel of a series, so that a tool built
// on multiprobe is tested on the attach paths its users' kernels take.
//
//	go run github.com/multiprobe/multiprobe/cmd/vmrun -kernel 5.10,6.1,6.12 ./... [-- -run TestX -v]
//
// It builds each package's test binary statically (CGO_ENABLED=0), packs
// the binaries, their testdata directories, busybox and an init script
// into an initramfs, boots each kernel with it, and runs every test binary
// there as root with CI=true, so that a test that cannot get what it needs
// fails rather than skips. It prints the guest's output and a line per
// kernel, and exits 1 if any kernel's tests failed.
//
// The series and what they lack:
//
//	5.10  bullseye  no uprobe_multi, no BPF cookies: per-site perf-event uprobes, a program copy per site
//	6.1   bookworm  no uprobe_multi: per-site perf-event uprobes
//	6.12  trixie    no uprobe sessions
//
// The guest has no compiler: C targets built with probetest.BuildC come
// from the host's build cache (~/.cache/multiprobe/probetest, or
// $MULTIPROBE_CACHE_DIR), which a run of the tests on the host fills, and
// which vmrun copies into the guest. Host programs a test runs go in with
// -files (their libraries with them); busybox provides sh and the usual
// commands.
//
// What it downloads, and where: the kernel package of each series
// (linux-image-*-cloud-amd64-unsigned, about 30 MB) from the machine's own
// Debian mirror, through a throw-away apt configuration that leaves the
// system's sources alone, into ~/.cache/multiprobe/oldkernel (or
// -cache), once per kernel release. What it needs: qemu-system-x86,
// busybox-static and apt (it installs the first two when they are missing,
// which needs root); KVM where /dev/kvm is usable, TCG emulation
// otherwise; the go command.
package main
