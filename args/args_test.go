package args_test

import (
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/multiprobe/multiprobe"
	"github.com/multiprobe/multiprobe/args"
	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/kernelprobe"
	"github.com/multiprobe/multiprobe/probetest"
)

func resolve(t *testing.T, specs ...string) *multiprobe.Plan {
	t.Helper()
	var probes []multiprobe.Probe
	for _, spec := range specs {
		ps, err := multiprobe.ParseProbes(spec)
		if err != nil {
			t.Fatal(err)
		}
		probes = append(probes, ps...)
	}
	plan, err := multiprobe.Resolve(probes, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { plan.Close() })
	return plan
}

// readAll reads t's hits until the flush after the run.
func readAll(t *testing.T, tr *args.Tracer) []args.Hit {
	t.Helper()
	if err := tr.Flush(); err != nil {
		t.Fatal(err)
	}
	var hits []args.Hit
	for {
		h, err := tr.Read()
		if errors.Is(err, args.ErrFlushed) {
			return hits
		}
		if err != nil {
			t.Fatal(err)
		}
		hits = append(hits, h)
	}
}

// TestTracer: the USDT target calls named(i, name_of(i)), which fires
// mp:named(i, name), with the names alpha, beta, gamma in turn: each hit
// carries the USDT probe's arguments, the function's first arguments and
// the return value, the strings read where they mean something, on both
// attach paths and without cookies.
func TestTracer(t *testing.T) {
	probetest.RequireBPF(t)
	target := testprogs.USDTTarget(t)
	for _, force := range []string{"", "fallback", "nocookie"} {
		t.Run(force, func(t *testing.T) {
			t.Setenv(kernelprobe.ForceEnv, force)
			before := probetest.TakeSnapshot(t)
			plan := resolve(t, "usdt:"+target+":mp:named", "uprobe:"+target+":named", "uretprobe:"+target+":name_of")
			tr, err := args.Attach(plan, &args.Options{Args: 1, Strings: []int{1, args.Ret}})
			if err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command(target, "3").CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", target, err, out)
			}
			hits := readAll(t, tr)
			got := map[string][]string{}
			for _, h := range hits {
				var line string
				switch h.Site.Probe.Kind {
				case multiprobe.USDT:
					line = fmt.Sprintf("%d %s", h.Args[0], h.Strings[1])
				case multiprobe.Entry:
					// Two arguments: the one asked for, and the string's.
					line = fmt.Sprintf("%d %d %s", len(h.Args), h.Args[0], h.Strings[1])
				case multiprobe.Return:
					line = fmt.Sprintf("%d %s", *h.Ret, h.Strings[args.Ret])
				}
				got[h.Site.Probe.Kind.String()] = append(got[h.Site.Probe.Kind.String()], line)
			}
			want := map[string][]string{
				"usdt":      {"0 alpha", "1 beta", "2 gamma"},
				"uprobe":    {"2 0 alpha", "2 1 beta", "2 2 gamma"},
				"uretprobe": nil,
			}
			for _, k := range []string{"usdt", "uprobe"} {
				if g := got[k]; !slices.Equal(g, want[k]) {
					t.Errorf("%s hits %q, want %q", k, g, want[k])
				}
			}
			if g := got["uretprobe"]; len(g) != 3 || !strings.HasSuffix(g[0], " alpha") || !strings.HasSuffix(g[2], " gamma") {
				t.Errorf("uretprobe hits %q, want name_of's values, alpha to gamma", g)
			}
			var n uint64
			for _, s := range plan.Sites() {
				var c uint64
				if err := tr.Map().Lookup(uint32(s.Cookie), &c); err != nil {
					t.Fatal(err)
				}
				n += c
			}
			if d, err := tr.Dropped(); n != uint64(len(hits)) || d != 0 || err != nil {
				t.Errorf("%d hits read, %d counted, %d dropped (%v)", len(hits), n, d, err)
			}
			if err := tr.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := tr.Read(); !errors.Is(err, args.ErrClosed) {
				t.Errorf("Read after Close: %v, want ErrClosed", err)
			}
			tr.Close()
			plan.Close()
			before.Check(t, "after Close")
		})
	}
}

// TestOptionsErrors: bad options are errors, before anything is loaded.
func TestOptionsErrors(t *testing.T) {
	for _, o := range []args.Options{
		{Strings: []int{0, 1, 2, 3}},
		{Strings: []int{12}},
		{Strings: []int{-2}},
		{Args: 7},
	} {
		if _, err := args.NewForWatch(nil, &o); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
	if _, err := args.New(nil, nil); err == nil {
		t.Error("nil plan: no error")
	}
}
