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
// back. -unpin, for removing the agent, detaches everything at exit and
// removes the pins.
//
// The agent needs root (CAP_SYS_ADMIN, CAP_BPF, CAP_PERFMON) and the
// node's pid namespace: it reads every process's /proc/PID/maps.
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
	"syscall"
)

// config is the agent's config file.
type config struct {
	// Listen is where /metrics is served (default ":9464").
	Listen string `json:"listen"`
	// PinDir is the directory on a BPF file system where the counts
	// are pinned (default /sys/fs/bpf/multiprobe-agent).
	PinDir string `json:"pin_dir"`
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
	if len(c.Probes) == 0 {
		return nil, fmt.Errorf("%s: no probes", path)
	}
	return c, nil
}

func main() {
	log.SetFlags(0)
	log.SetPrefix("agent: ")
	path := flag.String("config", "/etc/multiprobe-agent/config.json", "the config `FILE`")
	verbose := flag.Bool("v", false, "log each file attached, skipped or detached")
	unpin := flag.Bool("unpin", false, "on exit, detach every probe and remove the pinned counts (when removing the agent from the node, not restarting it)")
	flag.Parse()
	if err := run(*path, *verbose, *unpin); err != nil {
		log.Fatal(err)
	}
}

// run starts the agent and serves /metrics until SIGINT or SIGTERM.
func run(path string, verbose, unpin bool) error {
	cfg, err := readConfig(path)
	if err != nil {
		return err
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
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return err
	}
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
