// Command agent is an example node agent built on multiprobe: it follows
// the probe specs of its config file into every process and container of
// the node, as they start (package watch), counts each probed function's
// calls and times them, and serves the numbers as OpenMetrics on /metrics
// for Prometheus to scrape and add up across the fleet: one agent per node
// (deploy/daemonset.yaml), run from the image deploy/Containerfile builds.
//
// The config file is JSON:
//
//	{
//	  "listen": ":9464",
//	  "pin_dir": "/sys/fs/bpf/multiprobe-agent",
//	  "probes": [
//	    {"name": "malloc", "spec": "uprobe:libc:malloc"},
//	    {"name": "tls_read", "spec": "uprobe:libssl:SSL_read"}
//	  ]
//	}
//
// Each uprobe spec is timed from the functions' entries to their returns.
// The counts and histograms live in BPF maps pinned under pin_dir (a BPF
// file system), with the names of the functions they are for, and so do
// the probes' links (watch.Options.PinDir): while an agent restarts, or
// is upgraded, its probes stay attached and count, and the next one takes
// them back, so the counters Prometheus sees miss no call and never go
// back. -uninstall (the uninstall Job, deploy/uninstall.yaml) detaches
// everything the last agent left and removes the pins; -unpin does the
// same when the agent exits.
//
// The agent needs root's capabilities (deploy/daemonset.yaml lists which
// and why) and the node's pid namespace: it reads every process's
// /proc/PID/maps. README.md says how to build, deploy, scrape, upgrade and
// remove it.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/elfsym"
	"golang.org/x/sys/unix"
)

// config is the agent's config file.
type config struct {
	// Listen is where /metrics is served (default ":9464").
	Listen string `json:"listen"`
	// PinDir is the directory on a BPF file system where the counts
	// are pinned (default /sys/fs/bpf/multiprobe-agent).
	PinDir string `json:"pin_dir"`
	// CgroupRoot, if not "", is where the node's cgroup v2 hierarchy is
	// mounted (or its unified/), whose directories name the containers
	// calls are counted by (default /sys/fs/cgroup). It must be the
	// node's: a cgroup the agent does not find there counts as gone, and
	// its calls leave the counts by container (not the node's total).
	CgroupRoot string `json:"cgroup_root,omitempty"`
	// Probes are what to count and time.
	Probes []probeConfig `json:"probes"`
}

// probeConfig is one probe spec and the name its metrics carry.
type probeConfig struct {
	Name string `json:"name"`
	Spec string `json:"spec"`
}

func readConfig(path string) (*config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	c := &config{Listen: ":9464", PinDir: "/sys/fs/bpf/multiprobe-agent"}
	if err := json.Unmarshal(data, c); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if err := c.check(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// check refuses a config the agent cannot run, before anything is
// attached: no probes, a probe without a name or with another's, a spec
// that does not parse or is not an entry probe.
func (c *config) check() error {
	if len(c.Probes) == 0 {
		return errors.New("no probes")
	}
	names := map[string]bool{}
	for _, p := range c.Probes {
		switch {
		case p.Name == "":
			return fmt.Errorf("probe %q: no name", p.Spec)
		case names[p.Name]:
			return fmt.Errorf("probe %s: two probes of that name", p.Name)
		}
		names[p.Name] = true
		ps, err := multiprobe.ParseProbes(p.Spec)
		if err != nil {
			return fmt.Errorf("probe %s: %w", p.Name, err)
		}
		for _, q := range ps {
			if q.Kind != multiprobe.Entry {
				return fmt.Errorf("probe %s (%s): the agent times functions: give uprobe:TARGET:PATTERN", p.Name, p.Spec)
			}
		}
	}
	return nil
}

// warnAbsent says, once at start, which probes' targets name no file in
// this root: a typo, or a library only containers have. They are still
// watched for.
func (c *config) warnAbsent() {
	for _, p := range c.Probes {
		ps, _ := multiprobe.ParseProbes(p.Spec)
		for _, q := range ps {
			var err error
			if strings.Contains(q.Target, "/") {
				_, err = elfsym.GlobIn("", q.Target)
			} else {
				_, err = elfsym.LookPath(q.Target)
			}
			if err != nil {
				log.Printf("warning: probe %s: no file here is %s (%v); the agent attaches it where one appears, in a container or later", p.Name, q.Target, err)
			}
		}
	}
}

func main() {
	log.SetFlags(0)
	log.SetPrefix("agent: ")
	path := flag.String("config", "/etc/multiprobe-agent/config.json", "the config `FILE`")
	verbose := flag.Bool("v", false, "log each file attached, skipped or detached")
	unpin := flag.Bool("unpin", false, "on exit, detach every probe and remove the pinned counts (when removing the agent from the node, not restarting it)")
	uninstall := flag.Bool("uninstall", false, "detach every probe a last agent left pinned under -pin-dir, remove the pins, and exit (deploy/uninstall.yaml)")
	pinDirFlag := flag.String("pin-dir", "/sys/fs/bpf/multiprobe-agent", "with -uninstall, the agents' pin_dir")
	mountBPFFS := flag.String("mount-bpffs", "", "mount a BPF file system at `DIR` unless one is there, and exit (the DaemonSet's init container)")
	sleep := flag.Bool("sleep", false, "do nothing until killed (the uninstall DaemonSet's pods, once done)")
	flag.Parse()
	var err error
	switch {
	case *uninstall:
		err = runUninstall(*pinDirFlag)
	case *mountBPFFS != "":
		err = mountBPF(*mountBPFFS)
	case *sleep:
		select {}
	default:
		err = run(*path, *verbose, *unpin)
	}
	if err != nil {
		log.Fatal(err)
	}
}

// run starts the agent and serves /metrics until SIGINT or SIGTERM.
func run(path string, verbose, unpin bool) error {
	cfg, err := readConfig(path)
	if err != nil {
		return err
	}
	// The port first: an agent that cannot serve attaches nothing.
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w (is another agent running?)", cfg.Listen, err)
	}
	defer ln.Close()
	cfg.warnAbsent()
	if cfg.CgroupRoot != "" {
		cgroupRoot = findCgroupRoot(cfg.CgroupRoot)
	}
	a, err := start(cfg, verbose)
	if err != nil {
		return err
	}
	defer func() {
		if err := a.close(unpin, cfg.PinDir); err != nil {
			log.Print(err)
		}
	}()
	srv := &http.Server{Handler: a.handler()}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		srv.Shutdown(context.Background())
	}()
	log.Printf("serving /metrics on %s", ln.Addr())
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// runUninstall removes what agents left on the node: it takes back the
// links and counts pinned under pinDir, detaches every probe and removes
// the pins. It needs no config (the ConfigMap may be gone with the
// DaemonSet): what was pinned says what it is. Nothing pinned is no
// error.
func runUninstall(pinDir string) error {
	if _, err := os.Stat(pinDir); errors.Is(err, os.ErrNotExist) {
		log.Printf("nothing pinned under %s", pinDir)
		return nil
	}
	// A probe that names no file: the watch takes back every pinned
	// file, whatever its probes, and attaches nothing new.
	cfg := &config{PinDir: pinDir, Probes: []probeConfig{{Name: "uninstall", Spec: "uprobe:/dev/null/multiprobe-agent-uninstall:none"}}}
	a, err := start(cfg, false)
	if err != nil {
		return err
	}
	if err := a.close(true, pinDir); err != nil {
		return err
	}
	if _, err := os.Stat(pinDir); !errors.Is(err, os.ErrNotExist) {
		ents, _ := os.ReadDir(pinDir)
		return fmt.Errorf("%s still there after the uninstall (%v): %v", pinDir, err, ents)
	}
	log.Printf("removed every probe and the pins under %s", pinDir)
	return nil
}

// mountBPF mounts a BPF file system at dir unless one is there: a node
// whose /sys/fs/bpf is no BPF file system (some distributions mount none)
// gets one, which the init container's Bidirectional mount propagation
// hands to the node and the agent.
func mountBPF(dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("-mount-bpffs %s: %w", dir, err)
	}
	if st.Type == unix.BPF_FS_MAGIC {
		log.Printf("%s is a BPF file system already", dir)
		return nil
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("-mount-bpffs: mount -t bpf bpf %s: %w", dir, err)
	}
	log.Printf("mounted a BPF file system on %s", dir)
	return nil
}
