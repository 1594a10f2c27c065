package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/multiprobe/multiprobe"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v3"
)

// mainEnv makes the test binary, started again, run as the agent.
const mainEnv = "AGENT_TEST_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(mainEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// need skips t where it cannot run, or fails it in CI, where it must.
func need(t *testing.T, ok bool, why string) {
	t.Helper()
	if ok {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal(why)
	}
	t.Skip(why)
}

// buildWorkload builds testdata's workload and its library into dir.
func buildWorkload(t *testing.T, dir string) (work, lib string) {
	t.Helper()
	_, err := exec.LookPath("gcc")
	need(t, err == nil, "gcc builds the workload")
	lib, work = filepath.Join(dir, "libwork.so"), filepath.Join(dir, "work")
	for _, args := range [][]string{
		{"-O1", "-shared", "-fPIC", "-o", lib, "testdata/libwork.c"},
		{"-O1", "-o", work, "testdata/work.c", "-L" + dir, "-lwork", "-Wl,-rpath," + dir},
	} {
		if out, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
			t.Fatalf("gcc %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	return work, lib
}

// startAgent runs the agent with the config at path and returns it and
// where it serves /metrics.
func startAgent(t *testing.T, path string, args ...string) (*exec.Cmd, string) {
	t.Helper()
	cmd, addr, _ := startAgentLogged(t, path, args...)
	return cmd, addr
}

// agentLog is what an agent logged.
type agentLog struct {
	mu    sync.Mutex
	lines []string
}

// matching returns the lines that hold s.
func (l *agentLog) matching(s string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			out = append(out, line)
		}
	}
	return out
}

// startAgentLogged is startAgent, with what the agent logs.
func startAgentLogged(t *testing.T, path string, args ...string) (*exec.Cmd, string, *agentLog) {
	t.Helper()
	logged := &agentLog{}
	cmd := exec.Command(os.Args[0], append([]string{"-config", path, "-v"}, args...)...)
	cmd.Env = append(os.Environ(), mainEnv+"=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	addr := make(chan string, 1)
	go func() {
		defer close(addr)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			t.Log(sc.Text())
			logged.mu.Lock()
			logged.lines = append(logged.lines, sc.Text())
			logged.mu.Unlock()
			if a, ok := strings.CutPrefix(sc.Text(), "agent: serving /metrics on "); ok {
				addr <- a
			}
		}
	}()
	select {
	case a, ok := <-addr:
		if !ok {
			t.Fatal("the agent ended before it served /metrics")
		}
		return cmd, a, logged
	case <-time.After(30 * time.Second):
		t.Fatal("the agent did not start serving /metrics")
	}
	return nil, "", nil
}

// stopAgent ends the agent as a DaemonSet's rollout does, with SIGTERM.
func stopAgent(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Errorf("the agent after SIGTERM: %v", err)
	}
}

// scrape reads /metrics, in the Prometheus text format, by family.
func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// work is the numbers of the function work, from a scrape.
type work struct {
	calls, timed   uint64
	sum, below05ms float64 // seconds in all; calls under 0.5 ms
}

func workMetrics(t *testing.T, fams map[string]*dto.MetricFamily) work {
	t.Helper()
	var w work
	for _, m := range fams["multiprobe_calls_total"].GetMetric() {
		if label(m, "function") == "work" && label(m, "probe") == "work" {
			w.calls = uint64(m.GetCounter().GetValue())
		}
	}
	for _, m := range fams["multiprobe_call_duration_seconds"].GetMetric() {
		if label(m, "function") == "work" {
			h := m.GetHistogram()
			w.timed, w.sum = h.GetSampleCount(), h.GetSampleSum()
			for _, b := range h.GetBucket() {
				if b.GetUpperBound() <= 0.0005 {
					w.below05ms = math.Max(w.below05ms, float64(b.GetCumulativeCount()))
				}
			}
		}
	}
	return w
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// TestAgent starts the agent on a config that probes a library, runs a
// workload that calls it a known number of times, each call a millisecond
// long, and scrapes /metrics: the calls, the histogram's count and sum,
// and no call under half a millisecond. The agent is then restarted, as an
// upgrade would, while the workload runs: its counters go on from where
// they were and miss nothing in between.
func TestAgent(t *testing.T) {
	need(t, os.Geteuid() == 0, "the agent needs root")
	dir := t.TempDir()
	workload, lib := buildWorkload(t, dir)
	path, pin := workConfig(t, dir, lib)
	run := func(n int) {
		t.Helper()
		if out, err := exec.Command(workload, fmt.Sprint(n), "1000").CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", workload, err, out)
		}
	}
	check := func(addr string, want uint64) {
		t.Helper()
		w := workMetrics(t, scrape(t, addr))
		if w.calls != want || w.timed != want || w.below05ms != 0 || w.sum < float64(want)*0.001 {
			t.Errorf("work: %d calls, %d timed, %g s in all, %g under 0.5 ms; want %d calls of 1 ms or more", w.calls, w.timed, w.sum, w.below05ms, want)
		} else {
			t.Logf("work: %d calls, %.3f s in all", w.calls, w.sum)
		}
	}

	agent, addr := startAgent(t, path)
	run(200)
	check(addr, 200)

	// OpenMetrics, to a scraper that asks for it.
	req, err := http.NewRequest("GET", "http://"+addr+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/openmetrics-text") || !strings.HasSuffix(string(body), "# EOF\n") {
		t.Errorf("asked for OpenMetrics, got %s:\n%s", ct, body)
	}

	// Restarted: the calls made while no agent ran are counted too (its
	// links stayed pinned), and so are those after.
	stopAgent(t, agent)
	run(50)
	agent, addr = startAgent(t, path)
	check(addr, 250)
	run(100)
	check(addr, 350)
	stopAgent(t, agent)

	// -uninstall, the Job that removes the agent from a node: nothing
	// stays pinned or attached (a run after it is counted nowhere: the
	// counts are gone with their pins).
	uninstall(t, pin)
	if _, err := os.Stat(pin); !os.IsNotExist(err) {
		ents, _ := os.ReadDir(pin)
		t.Errorf("after -uninstall the pin directory is still there (%v): %v", err, ents)
	}
	if ids := agentLinks(t); len(ids) != 0 {
		t.Errorf("after -uninstall %d uprobe links are left", len(ids))
	}
	uninstall(t, pin) // again: nothing to do, no error

	// -unpin does the same when the agent exits.
	agent, _ = startAgent(t, path, "-unpin")
	stopAgent(t, agent)
	if _, err := os.Stat(pin); !os.IsNotExist(err) {
		ents, _ := os.ReadDir(pin)
		t.Errorf("after -unpin the pin directory is still there (%v): %v", err, ents)
	}
}

// uninstall runs the agent as deploy/uninstall.yaml does, on pin.
func uninstall(t *testing.T, pin string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-uninstall", "-pin-dir", pin)
	cmd.Env = append(os.Environ(), mainEnv+"=1")
	out, err := cmd.CombinedOutput()
	t.Logf("-uninstall: %s", bytes.TrimSpace(out))
	if err != nil {
		t.Fatalf("-uninstall: %v", err)
	}
}

// agentLinks lists the kernel's uprobe_multi and perf links of programs
// named agent_probe.
func agentLinks(t *testing.T) []link.ID {
	t.Helper()
	var ids []link.ID
	it := new(link.Iterator)
	defer it.Close()
	for it.Next() {
		info, err := it.Link.Info()
		if err != nil {
			continue
		}
		prog, err := ebpf.NewProgramFromID(info.Program)
		if err != nil {
			continue
		}
		pi, err := prog.Info()
		prog.Close()
		if err == nil && strings.HasPrefix(pi.Name, "agent_probe") {
			ids = append(ids, it.ID)
		}
	}
	return ids
}

// TestConfigCheck: a config the agent cannot run is refused before
// anything is attached, with the probe named.
func TestConfigCheck(t *testing.T) {
	for _, tc := range []struct {
		name   string
		probes []probeConfig
		want   string // in the error; "" for none
	}{
		{"good", []probeConfig{{"malloc", "uprobe:libc:malloc"}, {"free", "uprobe:libc:free"}}, ""},
		{"no probes", nil, "no probes"},
		{"no name", []probeConfig{{"", "uprobe:libc:malloc"}}, "no name"},
		{"twice", []probeConfig{{"m", "uprobe:libc:malloc"}, {"m", "uprobe:libc:free"}}, "two probes"},
		{"bad spec", []probeConfig{{"m", "uprobe:libc"}}, "probe m"},
		{"return probe", []probeConfig{{"m", "uretprobe:libc:malloc"}}, "times functions"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := (&config{Probes: tc.probes}).check()
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("check: %v, want %q", err, tc.want)
			}
		})
	}
}

// TestAgentFailsFast: an agent whose port is taken exits at once with an
// error that says so, having attached and pinned nothing; a pattern that
// matches no function of a library (a typo) and a library that is not
// on the node are each a warning, the first said once for libc however
// many processes map it.
func TestAgentFailsFast(t *testing.T) {
	need(t, os.Geteuid() == 0, "the agent needs root")
	dir := t.TempDir()
	bpffs := testBPFFS(t, dir)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	write := func(c config) string {
		data, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, "config.json")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	pin := filepath.Join(bpffs, "agent")
	path := write(config{Listen: taken.Addr().String(), PinDir: pin, Probes: []probeConfig{{"malloc", "uprobe:libc:malloc"}}})
	cmd := exec.Command(os.Args[0], "-config", path)
	cmd.Env = append(os.Environ(), mainEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "address already in use") {
		t.Errorf("an agent on a port taken: %v, %s; want it to fail with EADDRINUSE", err, out)
	}
	if _, err := os.Stat(pin); !os.IsNotExist(err) {
		t.Errorf("an agent that could not listen left %s (%v)", pin, err)
	}

	path = write(config{Listen: "127.0.0.1:0", PinDir: pin, Probes: []probeConfig{
		{"typo", "uprobe:libc:mallocc"}, {"absent", "uprobe:libmultiprobe-absent:f"}}})
	agent, _, logged := startAgentLogged(t, path, "-unpin")
	for range 5 {
		if out, err := exec.Command("true").CombinedOutput(); err != nil {
			t.Fatalf("true: %v %s", err, out)
		}
	}
	time.Sleep(500 * time.Millisecond)
	stopAgent(t, agent)
	if w := logged.matching("warning: probe absent"); len(w) != 1 {
		t.Errorf("the absent library: %d warnings, want 1: %q", len(w), w)
	}
	libc := 0
	for _, l := range logged.matching("skipped") {
		if strings.Contains(l, "libc.so") {
			libc++
		}
	}
	if libc != 1 {
		t.Errorf("libc, whose functions match no mallocc: said %d times, want once (the lines: %q)", libc, logged.matching("skipped"))
	}
}

// TestDeployConfig: the image's config file parses, its probe specs do,
// and the DaemonSet's ConfigMap holds the same config.
func TestDeployConfig(t *testing.T) {
	cfg, err := readConfig("deploy/config.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range cfg.Probes {
		if _, err := multiprobe.ParseProbes(p.Spec); err != nil {
			t.Errorf("probe %s: %v", p.Name, err)
		}
	}
	ds, err := os.ReadFile("deploy/daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// The block under "config.json: |", its indentation taken off.
	_, block, ok := strings.Cut(string(ds), "config.json: |\n")
	if !ok {
		t.Fatal("no config.json in the DaemonSet's ConfigMap")
	}
	var lines []string
	for _, l := range strings.Split(block, "\n") {
		if !strings.HasPrefix(l, "    ") {
			break
		}
		lines = append(lines, strings.TrimPrefix(l, "    "))
	}
	var inMap config
	if err := json.Unmarshal([]byte(strings.Join(lines, "\n")), &inMap); err != nil {
		t.Fatalf("the ConfigMap's config.json: %v", err)
	}
	if fmt.Sprint(inMap) != fmt.Sprint(*cfg) {
		t.Errorf("the ConfigMap's config %+v differs from deploy/config.json's %+v", inMap, *cfg)
	}
}

// TestAgentSamePath: the workload runs on the host and in a "container"
// (a mount namespace of its own where the workload's directory is another
// copy: the same paths, other files, as a Debian container's libc is at
// the host's path). Both copies are attached, and every scrape, while
// both run and after the container's exited, is HTTP 200, parses with
// Prometheus's text parser and passes its lint (promtool check metrics'
// rules), with one multiprobe_file_users series per file that a process
// maps. Before, the two files were one series twice: HTTP 500 ("was
// collected before with the same name and label values") for as long as
// the container's file stayed attached.
func TestAgentSamePath(t *testing.T) {
	need(t, os.Geteuid() == 0, "the agent needs root")
	unshare, err := exec.LookPath("unshare")
	need(t, err == nil, "unshare runs the container")
	dir := t.TempDir()
	workload, lib := buildWorkload(t, dir)
	other := t.TempDir()
	for _, f := range []string{workload, lib} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(other, filepath.Base(f)), data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	path, _ := workConfig(t, dir, lib)
	agent, addr := startAgent(t, path, "-unpin")
	defer stopAgent(t, agent)

	host := exec.Command(workload, "4000", "1000")
	container := exec.Command(unshare, "-m", "--propagation", "private", "sh", "-c", `mount --bind "$1" "$2" && exec "$3" 1500 1000`, "sh", other, dir, workload)
	for _, c := range []*exec.Cmd{host, container} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
	}
	defer host.Process.Kill()
	users := func() map[string]float64 {
		t.Helper()
		out := map[string]float64{}
		for _, m := range checkedScrape(t, addr)["multiprobe_file_users"].GetMetric() {
			if label(m, "path") == lib {
				out[label(m, "file")] = m.GetGauge().GetValue()
			}
		}
		return out
	}
	var both map[string]float64
	for deadline := time.Now().Add(10 * time.Second); len(both) < 2; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the host's and the container's %s: %v, want two files", lib, both)
		}
		both = users()
	}
	if err := container.Wait(); err != nil {
		t.Fatalf("the container: %v", err)
	}
	var after map[string]float64
	for deadline := time.Now().Add(10 * time.Second); len(after) != 1; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after the container exited: %v, want the host's file alone", after)
		}
		after = users()
	}
	t.Logf("while both ran: %v; after the container exited: %v", both, after)
}

// checkedScrape is scrape, after checking the response as Prometheus
// would: HTTP 200, and no problem promlint finds.
func checkedScrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %s\n%s", resp.Status, body)
	}
	problems, err := promlint.New(bytes.NewReader(body)).Lint()
	if err != nil {
		t.Fatalf("promlint: %v\n%s", err, body)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parsing /metrics: %v\n%s", err, body)
	}
	return fams
}

// TestDeployManifests: what the manifests say is what the agent does: one
// image for every container, usable when loaded onto a node (pulled
// IfNotPresent); the agent not privileged, with the capabilities it
// needs; its probes on endpoints it serves; its port the config's; the
// node's BPF file system where pin_dir is, mounted by the init container
// with the flag the agent has; the Service and the PodMonitor selecting
// the agent's pods by port name; the uninstall DaemonSet on the same
// pin_dir.
func TestDeployManifests(t *testing.T) {
	docs := map[string]map[string]any{} // by kind/name
	for _, f := range []string{"deploy/daemonset.yaml", "deploy/uninstall.yaml", "deploy/podmonitor.yaml"} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(data))
		for {
			var doc map[string]any
			if err := dec.Decode(&doc); err == io.EOF {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			docs[fmt.Sprint(doc["kind"], "/", get(t, doc, "metadata", "name"))] = doc
		}
	}
	cfg, err := readConfig("deploy/config.json")
	if err != nil {
		t.Fatal(err)
	}
	_, port, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		t.Fatal(err)
	}
	handler := (&agent{}).handler()

	ds := docs["DaemonSet/multiprobe-agent"]
	pod := get(t, ds, "spec", "template", "spec").(map[string]any)
	if pod["hostPID"] != true {
		t.Error("the agent's pod is not in the node's pid namespace (hostPID)")
	}
	images := map[string]bool{}
	containers := func(pod map[string]any, key string) []map[string]any {
		var out []map[string]any
		list, _ := pod[key].([]any)
		for _, c := range list {
			c := c.(map[string]any)
			images[fmt.Sprint(c["image"])] = true
			if c["imagePullPolicy"] != "IfNotPresent" {
				t.Errorf("container %v: imagePullPolicy %v, want IfNotPresent (a locally loaded image)", c["name"], c["imagePullPolicy"])
			}
			out = append(out, c)
		}
		return out
	}
	agentC := containers(pod, "containers")[0]
	initC := containers(pod, "initContainers")[0]
	sc := agentC["securityContext"].(map[string]any)
	if sc["privileged"] == true {
		t.Error("the agent container is privileged; its capabilities suffice")
	}
	caps := fmt.Sprint(get(t, sc, "capabilities", "add"))
	for _, c := range []string{"BPF", "PERFMON", "SYS_ADMIN", "SYS_PTRACE"} {
		if !strings.Contains(caps, c) {
			t.Errorf("the agent container lacks CAP_%s (has %s)", c, caps)
		}
	}
	for _, probe := range []string{"livenessProbe", "readinessProbe"} {
		path := fmt.Sprint(get(t, agentC, probe, "httpGet", "path"))
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		if rec.Code != http.StatusOK {
			t.Errorf("%s %s: the agent answers %d", probe, path, rec.Code)
		}
		if p := get(t, agentC, probe, "httpGet", "port"); p != "metrics" {
			t.Errorf("%s on port %v, want the metrics port", probe, p)
		}
	}
	ports := agentC["ports"].([]any)[0].(map[string]any)
	if fmt.Sprint(ports["containerPort"]) != port || ports["name"] != "metrics" {
		t.Errorf("the agent's port %v (%v), the config listens on %s", ports["containerPort"], ports["name"], port)
	}
	bpffsAt := func(c map[string]any) string {
		for _, m := range c["volumeMounts"].([]any) {
			m := m.(map[string]any)
			if m["name"] == "bpffs" {
				return fmt.Sprint(m["mountPath"])
			}
		}
		return ""
	}
	if at := bpffsAt(agentC); at == "" || !strings.HasPrefix(cfg.PinDir, at+"/") {
		t.Errorf("the BPF file system is mounted at %q, pin_dir is %s", at, cfg.PinDir)
	}
	if args := fmt.Sprint(initC["command"]); !strings.Contains(args, "-mount-bpffs "+bpffsAt(initC)) {
		t.Errorf("the init container runs %s, want the agent's -mount-bpffs on its bpffs mount", args)
	}
	if args := fmt.Sprint(agentC["args"]); !strings.Contains(args, "-config /etc/multiprobe-agent/config.json") {
		t.Errorf("the agent's args %s", args)
	}

	labels := fmt.Sprint(get(t, ds, "spec", "template", "metadata", "labels"))
	svc := docs["Service/multiprobe-agent"]
	if sel := fmt.Sprint(get(t, svc, "spec", "selector")); sel != labels {
		t.Errorf("the Service selects %s, the pods are %s", sel, labels)
	}
	pm := docs["PodMonitor/multiprobe-agent"]
	if sel := fmt.Sprint(get(t, pm, "spec", "selector", "matchLabels")); sel != labels {
		t.Errorf("the PodMonitor selects %s, the pods are %s", sel, labels)
	}

	un := docs["DaemonSet/multiprobe-agent-uninstall"]
	upod := get(t, un, "spec", "template", "spec").(map[string]any)
	uc := containers(upod, "initContainers")[0]
	containers(upod, "containers")
	if args := fmt.Sprint(uc["args"]); !strings.Contains(args, "-uninstall -pin-dir "+cfg.PinDir) {
		t.Errorf("the uninstall runs %s, want -uninstall -pin-dir %s", args, cfg.PinDir)
	}
	if len(images) != 1 {
		t.Errorf("the manifests name %d images, want one: %v", len(images), images)
	}
}

// get walks a decoded YAML document by keys.
func get(t *testing.T, doc map[string]any, keys ...string) any {
	t.Helper()
	var v any = doc
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("no %s in the manifest", strings.Join(keys, "."))
		}
		v = m[k]
	}
	return v
}

// TestMountBPFFS: the init container's -mount-bpffs mounts a BPF file
// system where there is none, and leaves one that is there alone.
func TestMountBPFFS(t *testing.T) {
	need(t, os.Geteuid() == 0, "mounting needs root")
	dir := t.TempDir()
	for range 2 {
		if err := mountBPF(dir); err != nil {
			t.Fatal(err)
		}
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	if st.Type != 0xcafe4a11 { // BPF_FS_MAGIC
		t.Errorf("%s: file system %#x, want a BPF one", dir, st.Type)
	}
	if err := syscall.Unmount(dir, 0); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Unmount(dir, 0); err == nil {
		t.Error("two BPF file systems were mounted, one on the other")
	}
}

// TestContainerOf: the container id and pod uid in the cgroup paths the
// runtimes write.
func TestContainerOf(t *testing.T) {
	const id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	const uid = "8e3f4b6c-1d2a-4c5b-9e8f-7a6b5c4d3e2f"
	under := strings.ReplaceAll(uid, "-", "_")
	for _, tc := range []struct {
		path string
		want container
	}{
		{"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + under + ".slice/cri-containerd-" + id + ".scope", container{id, uid}},
		{"kubepods.slice/kubepods-pod" + under + ".slice/crio-" + id + ".scope", container{id, uid}},
		{"kubepods/burstable/pod" + uid + "/" + id, container{id, uid}},
		{"machine.slice/libpod-" + id + ".scope/container", container{id: id}},
		{"machine.slice/libpod-payload-" + id, container{id: id}},
		{"system.slice/docker-" + id + ".scope", container{id: id}},
		{"system.slice/ssh.service", container{}},
		{"user.slice/user-1000.slice/session-3.scope", container{}},
		{"", container{}},
	} {
		if got := containerOf(tc.path); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.path, got, tc.want)
		}
	}
}

// TestAgentContainers: calls counted by container, from the cgroups the
// workload runs in (a containerd container of a pod, a podman one, and
// the node's own), exact against what each made; the node's total is
// their sum; a cgroup removed (its container gone) leaves the output and
// the total does not change.
func TestAgentContainers(t *testing.T) {
	need(t, os.Geteuid() == 0, "the agent needs root")
	var st syscall.Statfs_t
	need(t, syscall.Statfs(cgroupRoot, &st) == nil && st.Type == cgroup2Magic, "a cgroup v2 hierarchy at "+cgroupRoot)
	const id1 = "1111111111111111111111111111111111111111111111111111111111111111"
	const id2 = "2222222222222222222222222222222222222222222222222222222222222222"
	const uid = "8e3f4b6c-1d2a-4c5b-9e8f-7a6b5c4d3e2f"
	top := filepath.Join(cgroupRoot, fmt.Sprintf("multiprobe-agent-test-%d.slice", os.Getpid()))
	c1 := filepath.Join(top, "kubepods-burstable-pod"+strings.ReplaceAll(uid, "-", "_")+".slice", "cri-containerd-"+id1+".scope")
	c2 := filepath.Join(top, "libpod-"+id2+".scope")
	for _, d := range []string{c1, c2} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, d := range []string{c1, filepath.Dir(c1), c2, top} {
			os.Remove(d)
		}
	})
	dir := t.TempDir()
	workload, lib := buildWorkload(t, dir)
	path, _ := workConfig(t, dir, lib)
	agent, addr := startAgent(t, path, "-unpin")
	defer stopAgent(t, agent)

	runIn := func(cgroup string, n int) {
		t.Helper()
		script := `exec "$1" "$2" 100`
		if cgroup != "" {
			script = `echo $$ > "$3/cgroup.procs" && ` + script
		}
		if out, err := exec.Command("sh", "-c", script, "sh", workload, fmt.Sprint(n), cgroup).CombinedOutput(); err != nil {
			t.Fatalf("the workload in %q: %v\n%s", cgroup, err, out)
		}
	}
	runIn(c1, 30)
	runIn(c2, 20)
	runIn("", 10)
	byContainer := func() map[container]uint64 {
		t.Helper()
		out := map[container]uint64{}
		for _, m := range checkedScrape(t, addr)["multiprobe_container_calls_total"].GetMetric() {
			if label(m, "function") == "work" {
				out[container{label(m, "container"), label(m, "pod")}] = uint64(m.GetCounter().GetValue())
			}
		}
		return out
	}
	want := map[container]uint64{{id1, uid}: 30, {id: id2}: 20, {}: 10}
	if got := byContainer(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("calls by container: %v, want %v", got, want)
	}
	if w := workMetrics(t, scrape(t, addr)); w.calls != 60 {
		t.Errorf("the node's calls: %d, want 60", w.calls)
	}

	// The podman container is gone: its cgroup removed.
	if err := os.Remove(c2); err != nil {
		t.Fatal(err)
	}
	delete(want, container{id: id2})
	if got := byContainer(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("calls by container after one is gone: %v, want %v", got, want)
	}
	if w := workMetrics(t, scrape(t, addr)); w.calls != 60 {
		t.Errorf("the node's calls after a container is gone: %d, want 60", w.calls)
	}
}

// workConfig writes, in dir, the config of an agent that times lib's work
// and pins under a BPF file system of the test's own, and returns its
// path and the pin_dir.
func workConfig(t *testing.T, dir, lib string) (path, pin string) {
	t.Helper()
	pin = filepath.Join(testBPFFS(t, dir), "agent")
	cfg, err := json.Marshal(config{Listen: "127.0.0.1:0", PinDir: pin, Probes: []probeConfig{{Name: "work", Spec: "uprobe:" + lib + ":work"}}})
	if err != nil {
		t.Fatal(err)
	}
	path = filepath.Join(dir, "config.json")
	if err := os.WriteFile(path, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	return path, pin
}

// testBPFFS mounts a BPF file system of the test's own in dir, where a
// node has one at /sys/fs/bpf, and returns where.
func testBPFFS(t *testing.T, dir string) string {
	t.Helper()
	bpffs := filepath.Join(dir, "bpffs")
	if err := os.Mkdir(bpffs, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("bpf", bpffs, "bpf", 0, ""); err != nil {
		t.Fatalf("mounting a BPF file system: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(bpffs, syscall.MNT_DETACH) })
	return bpffs
}

// probeCalls is the calls a scrape gives for each function of each probe,
// "probe function" -> calls.
func probeCalls(fams map[string]*dto.MetricFamily) map[string]uint64 {
	out := map[string]uint64{}
	for _, m := range fams["multiprobe_calls_total"].GetMetric() {
		out[label(m, "probe")+" "+label(m, "function")] = uint64(m.GetCounter().GetValue())
	}
	return out
}

// writeConfig writes, as dir/name, the config of an agent pinning under
// pin with probes.
func writeConfig(t *testing.T, dir, name, pin string, probes ...probeConfig) string {
	t.Helper()
	cfg, err := json.Marshal(config{Listen: "127.0.0.1:0", PinDir: pin, Probes: probes})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestAgentConfigChange: the agent is restarted with another config (a
// probe added, one removed, one kept) while a workload calls all three
// functions: the kept one misses no call and counts none twice, the added
// one counts from the restart on, the removed one's series are gone, and
// a run after the restart is counted in full by the new config alone.
func TestAgentConfigChange(t *testing.T) {
	need(t, os.Geteuid() == 0, "the agent needs root")
	dir := t.TempDir()
	workload, lib := buildWorkload(t, dir)
	pin := filepath.Join(testBPFFS(t, dir), "agent")
	probe := func(name string) probeConfig { return probeConfig{Name: name, Spec: "uprobe:" + lib + ":" + name} }
	before := writeConfig(t, dir, "before.json", pin, probe("work"), probe("idle"))
	after := writeConfig(t, dir, "after.json", pin, probe("work"), probe("rest"))
	run := func(n int) {
		t.Helper()
		if out, err := exec.Command(workload, fmt.Sprint(n), "1000").CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", workload, err, out)
		}
	}

	agent, addr := startAgent(t, before)
	run(100)
	if got := probeCalls(checkedScrape(t, addr)); got["work work"] != 100 || got["idle idle"] != 100 {
		t.Errorf("before the restart: %v, want 100 calls of work and of idle", got)
	}
	// A workload of 2,000 calls, 1 ms each, runs across the restart.
	long := exec.Command(workload, "2000", "1000")
	if err := long.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	stopAgent(t, agent)
	agent, addr, logged := startAgentLogged(t, after)
	if err := long.Wait(); err != nil {
		t.Fatal(err)
	}
	fams := checkedScrape(t, addr)
	got := probeCalls(fams)
	if got["work work"] != 2100 {
		t.Errorf("work (kept): %d calls counted across the restart, the workloads made 2,100", got["work work"])
	}
	if n := got["rest rest"]; n == 0 || n >= 2000 {
		t.Errorf("rest (added): %d calls counted, want some of the 2,000 (those after the restart)", n)
	}
	for k := range got {
		if strings.HasPrefix(k, "idle ") || strings.HasPrefix(k, " ") {
			t.Errorf("after the restart: a series of %q, a probe no longer configured", k)
		}
	}
	for _, m := range fams["multiprobe_container_calls_total"].GetMetric() {
		if p := label(m, "probe"); p != "work" && p != "rest" {
			t.Errorf("after the restart: a container series of probe %q", p)
		}
	}
	if len(logged.matching("updated")) == 0 {
		t.Errorf("the agent did not log the pinned link updated to the new config")
	}
	t.Logf("across the restart: work %d, rest %d of 2,000", got["work work"], got["rest rest"])
	rest := got["rest rest"]
	run(50)
	got = probeCalls(checkedScrape(t, addr))
	if got["work work"] != 2150 || got["rest rest"] != rest+50 {
		t.Errorf("a run after the restart: work %d, rest %d; want 2,150 and %d", got["work work"], got["rest rest"], rest+50)
	}
	stopAgent(t, agent)
	uninstall(t, pin)
	if ids := agentLinks(t); len(ids) != 0 {
		t.Errorf("after -uninstall %d uprobe links are left", len(ids))
	}
}
