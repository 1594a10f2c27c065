package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/multiprobe/multiprobe/internal/testprogs"
	"github.com/multiprobe/multiprobe/internal/testutil"
)

func runCLI(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var o, e bytes.Buffer
	code = run(args, &o, &e)
	return o.String(), e.String(), code
}

// TestCount runs a generated target under `count` and checks the printed
// counts against the calls the target makes.
func TestCount(t *testing.T) {
	testutil.RequireBPF(t)
	const n, calls = 30, 2
	target := testprogs.PrivateTarget(t, n)
	out, errOut, code := runCLI(t, "count", "--json", "--stats", "uprobe:"+target+":func_*", "--", target, fmt.Sprint(calls))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var r countReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if r.Sites != n || r.Called != n {
		t.Fatalf("report: %d sites, %d called; want %d", r.Sites, r.Called, n)
	}
	var total uint64
	for _, c := range r.Counts {
		var i int
		fmt.Sscanf(c.Function, "func_%05d", &i)
		if want := uint64(testprogs.ExpectedCalls(i, calls)); c.Calls != want {
			t.Errorf("%s: %d calls, want %d", c.Function, c.Calls, want)
		}
		total += c.Calls
	}
	if r.Stats == nil || r.Stats.Runs != total {
		t.Errorf("stats %+v: want %d runs, one per counted call", r.Stats, total)
	}

	// The table form.
	out, errOut, code = runCLI(t, "count", "uprobe:"+target+":func_0000[0-2]", "--", target, "1")
	if code != 0 || !strings.Contains(out, "func_00002") || !strings.Contains(out, "calls to 3 of 3 sites") {
		t.Errorf("exit %d, output:\n%s%s", code, out, errOut)
	}
}

// TestCountUSDT counts USDT probes and prints their arguments.
func TestCountUSDT(t *testing.T) {
	testutil.RequireBPF(t)
	target := testprogs.USDTTarget(t)
	out, errOut, code := runCLI(t, "count", "--args", "usdt:"+target+":mp:tick", "--", target, "3")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for i := 0; i < 3; i++ {
		if line := fmt.Sprintf("mp:tick %d %d\n", i, -3*i); !strings.Contains(out, line) {
			t.Errorf("output lacks %q:\n%s", line, out)
		}
	}
	out, errOut, code = runCLI(t, "count", "usdt:"+target+":mp:*", "--", target, "4")
	if code != 0 || !strings.Contains(out, "50  mp:inlined") || !strings.Contains(out, "4  mp:guarded") {
		t.Errorf("exit %d, output:\n%s%s", code, out, errOut)
	}
}

func TestUSDTList(t *testing.T) {
	target := testprogs.USDTTarget(t)
	tests := []struct {
		args     []string
		code     int
		contains string
	}{
		{[]string{"usdt", target}, 0, "mp:inlined  50"},
		{[]string{"usdt", target, "mp:t*"}, 0, "arg1=s32"},
		{[]string{"usdt", target, "nope:*"}, 1, "no matching USDT probes"},
		{[]string{"usdt"}, 2, "need a target"},
		{[]string{"usdt", "/bin/true"}, 1, "no .note.stapsdt"},
	}
	for _, tt := range tests {
		out, errOut, code := runCLI(t, tt.args...)
		if code != tt.code || !strings.Contains(out+errOut, tt.contains) {
			t.Errorf("%q: exit %d, output:\n%s%s\nwant exit %d containing %q", tt.args, code, out, errOut, tt.code, tt.contains)
		}
	}
	out, _, code := runCLI(t, "usdt", "--json", target, "mp:tick")
	var r struct {
		Probes []struct {
			Sites []struct {
				Args []map[string]any
			}
		}
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil || code != 0 || len(r.Probes) != 1 || len(r.Probes[0].Sites[0].Args) != 2 {
		t.Errorf("JSON (%v, exit %d): %s", err, code, out)
	}
}
