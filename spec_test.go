package multiprobe

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestParseProbe(t *testing.T) {
	tests := []struct {
		spec string
		want Probe
	}{
		{"uprobe:/bin/bash:readline", Probe{Entry, "/bin/bash", []string{"readline"}}},
		{"uretprobe:libc.so.6:malloc", Probe{Return, "libc.so.6", []string{"malloc"}}},
		{"u:bash:sh_*,!sh_free*", Probe{Entry, "bash", []string{"sh_*", "!sh_free*"}}},
		{"ur:/usr/lib/x.so:a,b,c", Probe{Return, "/usr/lib/x.so", []string{"a", "b", "c"}}},
		{"uprobe:/proc/42/root/usr/bin/app:main.*", Probe{Entry, "/proc/42/root/usr/bin/app", []string{"main.*"}}},
		{"uprobe:/weird:dir/bin:f", Probe{Entry, "/weird:dir/bin", []string{"f"}}},
	}
	for _, tt := range tests {
		got, err := ParseProbe(tt.spec)
		if err != nil {
			t.Errorf("ParseProbe(%q): %v", tt.spec, err)
			continue
		}
		if got.Kind != tt.want.Kind || got.Target != tt.want.Target || !slices.Equal(got.Patterns, tt.want.Patterns) {
			t.Errorf("ParseProbe(%q) = %+v, want %+v", tt.spec, got, tt.want)
		}
		if again, err := ParseProbe(got.String()); err != nil || again.String() != got.String() {
			t.Errorf("round trip of %q: %v, %v", got.String(), again, err)
		}
	}
}

// TestParseProbesList: bpftrace's list of probes in one argument is that
// many probes to ParseProbes, and an error naming them to ParseProbe.
func TestParseProbesList(t *testing.T) {
	tests := []struct {
		spec string
		want []string
	}{
		{"uprobe:/bin/bash:xmalloc,uretprobe:/bin/bash:xfree", []string{"uprobe:/bin/bash:xmalloc", "uretprobe:/bin/bash:xfree"}},
		{"u:bash:a,b,ur:bash:c,usdt:/x:p:n", []string{"uprobe:bash:a,b", "uretprobe:bash:c", "usdt:/x:p:n"}},
		{"uprobe:/bin/bash:u,uprobe_x", []string{"uprobe:/bin/bash:u,uprobe_x"}},
	}
	for _, tt := range tests {
		probes, err := ParseProbes(tt.spec)
		if err != nil {
			t.Errorf("ParseProbes(%q): %v", tt.spec, err)
			continue
		}
		var got []string
		for _, p := range probes {
			got = append(got, p.String())
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("ParseProbes(%q) = %q, want %q", tt.spec, got, tt.want)
		}
		if len(tt.want) > 1 {
			if _, err := ParseProbe(tt.spec); !errors.Is(err, ErrBadSpec) || !strings.Contains(err.Error(), "spec of its own") {
				t.Errorf("ParseProbe(%q) = %v, want ErrBadSpec saying to give each on its own", tt.spec, err)
			}
		}
	}
}

func TestParseProbeErrors(t *testing.T) {
	for _, spec := range []string{
		"", "uprobe", "uprobe:/bin/bash", "kprobe:/bin/bash:f", "uprobe::f",
		"uprobe:/bin/bash:", "uprobe:/bin/bash:a,,b", "uprobe:/bin/bash:!a", "uprobe:/bin/bash:!",
	} {
		if _, err := ParseProbe(spec); !errors.Is(err, ErrBadSpec) {
			t.Errorf("ParseProbe(%q) = %v, want ErrBadSpec", spec, err)
		}
	}
}

// TestOneValidation: a Probe built by hand is held to the rules a parsed
// one is. Where its text parses back to it, Resolve's check and ParseProbe
// give the same verdict and the same message; where it does not (a
// pattern with ':' or ',', which the text cannot carry), check refuses it.
func TestOneValidation(t *testing.T) {
	for _, p := range []Probe{
		{Entry, "/bin/bash", []string{"xmalloc"}},
		{Return, "/bin/bash", []string{"x*", "!xfree"}},
		{USDT, "/usr/bin/python3", []string{"python:line"}},
		{USDT, "/usr/bin/python3", []string{"python:line,gc"}},
		{USDT, "/usr/bin/python3", []string{"!python:line"}},
		{USDT, "/usr/bin/python3", []string{"python:"}},
		{USDT, "/usr/bin/python3", []string{"a:b", "c:d"}},
		{USDT, "", []string{"a:b"}},
		{Entry, "/bin/bash", []string{"a:b"}},
		{Entry, "/bin/bash", []string{"a,b"}},
		{Entry, "/bin/bash", nil},
		{Entry, "/bin/bash", []string{"!a"}},
		{Entry, "/bin/bash", []string{""}},
		{Entry, "/bin/bash", []string{"!"}},
		{Return, "", []string{"f"}},
		{Kind(7), "/bin/bash", []string{"f"}},
	} {
		checked := p.check("")
		q, parsed := ParseProbe(p.String())
		roundTrip := parsed == nil && q.Kind == p.Kind && q.Target == p.Target && slices.Equal(q.Patterns, p.Patterns)
		switch {
		case roundTrip && checked != nil:
			t.Errorf("%#v: parses from %q, but check says %v", p, p.String(), checked)
		case !roundTrip && checked == nil:
			t.Errorf("%#v: check takes it, but its text %q parses to %#v, %v", p, p.String(), q, parsed)
		case checked != nil && parsed != nil && p.Kind != Kind(7) && checked.Error() != parsed.Error():
			t.Errorf("%#v: check says %q, ParseProbe %q", p, checked, parsed)
		}
	}
}

func FuzzParseProbe(f *testing.F) {
	f.Add("uprobe:/bin/bash:sh_*,!sh_free")
	f.Add("ur:libc.so.6:malloc")
	f.Fuzz(func(t *testing.T, spec string) {
		p, err := ParseProbe(spec)
		if err != nil {
			return
		}
		again, err := ParseProbe(p.String())
		if err != nil || again.String() != p.String() {
			t.Fatalf("%q parsed to %q, which reparses to %q, %v", spec, p.String(), again.String(), err)
		}
	})
}
