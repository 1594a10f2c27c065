package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// podman runs podman with args and returns what it printed, trimmed.
func podman(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("podman", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(bytes.TrimSpace(out))
}

// podmanImage makes, from the host's files, an image holding only the
// workload (built to find libwork in /opt/work) and the libraries it
// loads, imports it as localhost/multiprobe-agent-test-NAME:PID, and
// returns its name. tag, written in the image, makes its layer another
// image's than one with another tag: its libwork is another file.
func podmanImage(t *testing.T, dir, name string) string {
	t.Helper()
	root := filepath.Join(dir, "rootfs-"+name)
	opt := filepath.Join(root, "opt/work")
	if err := os.MkdirAll(opt, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"-O1", "-shared", "-fPIC", "-o", filepath.Join(opt, "libwork.so"), "testdata/libwork.c"},
		{"-O1", "-o", filepath.Join(opt, "work"), "testdata/work.c", "-L" + opt, "-lwork", "-Wl,-rpath,/opt/work"},
	} {
		if out, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
			t.Fatalf("gcc %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	// The C library and the dynamic loader, where the host has them.
	out, err := exec.Command("ldd", filepath.Join(opt, "work")).CombinedOutput()
	if err != nil {
		t.Fatalf("ldd: %v\n%s", err, out)
	}
	for _, lib := range regexp.MustCompile(`(/[^ ]+\.so[^ ]*) \(0x`).FindAllStringSubmatch(string(out), -1) {
		if strings.Contains(lib[1], "libwork") {
			continue
		}
		dst := filepath.Join(root, lib[1])
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("cp", "-L", lib[1], dst).CombinedOutput(); err != nil {
			t.Fatalf("cp %s: %v\n%s", lib[1], err, out)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "image"), []byte(name+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tar := root + ".tar"
	if out, err := exec.Command("tar", "-C", root, "-cf", tar, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v\n%s", err, out)
	}
	image := fmt.Sprintf("localhost/multiprobe-agent-test-%s:%d", name, os.Getpid())
	podman(t, "import", "-q", tar, image)
	t.Cleanup(func() { exec.Command("podman", "rmi", "-f", image).Run() })
	return image
}

// podmanRun starts a container of image whose workload makes n calls at
// each SIGUSR1, and returns its id.
func podmanRun(t *testing.T, image string, n int) string {
	t.Helper()
	args := []string{"run", "-d", "--pull=never", "--network=none",
		// Within the limits a test VM's root may set (it may lack
		// CAP_SYS_RESOURCE); podman's defaults are far above them.
		"--ulimit=nofile=1024:1024", "--ulimit=nproc=1024:1024"}
	if _, err := exec.LookPath("runc"); err == nil && !unifiedCgroups() {
		// crun refuses a host with cgroup v1 and v2 both mounted
		// ("cgroups in hybrid mode not supported"); runc takes it.
		args = append(args, "--runtime=runc")
	}
	args = append(args, image, "/opt/work/work", fmt.Sprint(n), "100", "wait")
	id := podman(t, args...)
	t.Cleanup(func() { exec.Command("podman", "rm", "-f", "-t", "0", id).Run() })
	return id
}

// unifiedCgroups reports whether /sys/fs/cgroup is cgroup v2 alone.
func unifiedCgroups() bool {
	return findCgroupRoot("/sys/fs/cgroup") == "/sys/fs/cgroup"
}

// TestAgentPodman: the agent against real containers, started by podman
// from images made here (overlay storage, their own mount, pid and
// network namespaces, a cgroup each): two containers of one image and
// one of another, each calling work a known number of times. The calls
// by container are exact against what each workload made, the two of one
// image map one file (one link, counting both), the agent restarted with
// a probe added while they run misses none of their later calls and
// counts the added one from the restart, and once they are gone their
// series leave the output while the node's total stays.
func TestAgentPodman(t *testing.T) {
	need(t, os.Geteuid() == 0, "the agent needs root")
	_, err := exec.LookPath("podman")
	need(t, err == nil, "podman runs the containers (.ci/install-deps installs it)")
	_, err = exec.LookPath("gcc")
	need(t, err == nil, "gcc builds the workload")
	dir := t.TempDir()
	imageA, imageB := podmanImage(t, dir, "a"), podmanImage(t, dir, "b")
	pin := filepath.Join(testBPFFS(t, dir), "agent")
	probe := func(name string) probeConfig { return probeConfig{Name: name, Spec: "uprobe:libwork:" + name} }
	before := writeConfig(t, dir, "before.json", pin, probe("work"))
	after := writeConfig(t, dir, "after.json", pin, probe("work"), probe("rest"))
	agent, addr := startAgent(t, before)
	defer func() { uninstall(t, pin) }()

	want := map[string]uint64{}
	ids := map[string]int{}
	for _, c := range []struct {
		image string
		n     int
	}{{imageA, 30}, {imageA, 20}, {imageB, 10}} {
		id := podmanRun(t, c.image, c.n)
		ids[id] = c.n
		want[id] = uint64(c.n)
	}
	// byContainer is the calls of probe's function by container id.
	byContainer := func(fams map[string]*dto.MetricFamily, probe string) map[string]uint64 {
		out := map[string]uint64{}
		for _, m := range fams["multiprobe_container_calls_total"].GetMetric() {
			if label(m, "probe") == probe {
				out[label(m, "container")] += uint64(m.GetCounter().GetValue())
			}
		}
		return out
	}
	// settled scrapes until the node's calls of work reach total.
	settled := func(addr string, total uint64) map[string]*dto.MetricFamily {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			fams := checkedScrape(t, addr)
			got := probeCalls(fams)["work work"]
			if got == total {
				return fams
			}
			if got > total || time.Now().After(deadline) {
				t.Fatalf("the node's calls of work: %d, want %d", got, total)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	// users is, by file, how many processes map the containers' libwork.
	users := func(fams map[string]*dto.MetricFamily) map[string]int {
		out := map[string]int{}
		for _, m := range fams["multiprobe_file_users"].GetMetric() {
			if label(m, "path") == "/opt/work/libwork.so" {
				out[label(m, "file")] = int(m.GetGauge().GetValue())
			}
		}
		return out
	}
	// call tells every container to make its calls, once the agent
	// attached its file.
	call := func(addr string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for fmt.Sprint(sortedValues(users(checkedScrape(t, addr)))) != "[1 2]" {
			if time.Now().After(deadline) {
				t.Fatalf("the containers' libwork: %v (file -> users); want two files, one with the two containers of one image", users(checkedScrape(t, addr)))
			}
			time.Sleep(20 * time.Millisecond)
		}
		for id := range ids {
			podman(t, "kill", "--signal=USR1", id)
		}
	}
	call(addr)
	fams := settled(addr, 60)
	if got := byContainer(fams, "work"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("calls by container: %v, want %v", got, want)
	} else {
		t.Logf("calls of work by container: %v, as the workloads made them; libwork files: %v", got, users(fams))
	}

	// Restarted with rest added, while the containers run; then each
	// makes its calls again.
	stopAgent(t, agent)
	agent, addr, logged := startAgentLogged(t, after)
	call(addr)
	fams = settled(addr, 120)
	for id, n := range ids {
		want[id] = uint64(2 * n)
	}
	if got := byContainer(fams, "work"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("calls of work by container across the restart: %v, want %v", got, want)
	}
	rest := map[string]uint64{}
	for id, n := range ids {
		rest[id] = uint64(n)
	}
	if got := byContainer(fams, "rest"); fmt.Sprint(got) != fmt.Sprint(rest) {
		t.Errorf("calls of rest (added at the restart) by container: %v, want %v", got, rest)
	} else {
		t.Logf("after the restart: work %v, rest %v by container", byContainer(fams, "work"), got)
	}
	if n := len(logged.matching("updated /opt/work/libwork.so")); n != 2 {
		t.Errorf("%d files updated to the new config, want the two libwork files", n)
	}

	// The containers are gone: their series too, not the node's calls.
	for id := range ids {
		podman(t, "rm", "-f", "-t", "0", id)
	}
	fams = checkedScrape(t, addr)
	if got := byContainer(fams, "work"); len(got) != 0 {
		t.Errorf("calls by container once the containers are gone: %v, want none", got)
	}
	if got := probeCalls(fams); got["work work"] != 120 || got["rest rest"] != 60 {
		t.Errorf("the node's calls once the containers are gone: %v, want work 120, rest 60", got)
	}
	stopAgent(t, agent)
}

// sortedValues returns m's values, sorted.
func sortedValues(m map[string]int) []int {
	var out []int
	for _, v := range m {
		out = append(out, v)
	}
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}
