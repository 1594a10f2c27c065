package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestList(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		code     int
		contains string
	}{
		{"table", []string{"list", "libc.so.6", "malloc", "strlen"}, 0, "IFUNC"},
		{"ifunc", []string{"list", "libc.so.6", "strlen"}, 0, "IFUNC's implementation on this machine (resolver at "},
		{"no args", []string{"list"}, 2, "need a target"},
		{"one arg", []string{"list", "/bin/sh"}, 2, "need a target"},
		{"bad flag", []string{"list", "--nope", "/bin/sh", "x"}, 2, "flag provided but not defined"},
		{"no match", []string{"list", "libc.so.6", "no_such_function_xyz"}, 1, "no function matches"},
		{"missing file", []string{"list", "/nonexistent/bin", "x"}, 1, "/nonexistent/bin"},
		{"unknown command", []string{"frobnicate"}, 2, "unknown command"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(tt.args, &stdout, &stderr)
			if code != tt.code {
				t.Fatalf("exit %d, want %d; stderr: %s", code, tt.code, stderr.String())
			}
			out := stdout.String() + stderr.String()
			if !strings.Contains(out, tt.contains) {
				t.Errorf("output %q does not contain %q", out, tt.contains)
			}
			if tt.code == 2 && strings.Count(strings.TrimSpace(stderr.String()), "\n") != 0 {
				t.Errorf("usage error is not one line: %q", stderr.String())
			}
		})
	}
}

func TestListJSON(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"list", "--json", "libc.so.6", "malloc"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	var got struct {
		Path  string
		Sites []listedSite
	}
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Sites) != 1 || got.Sites[0].Name != "malloc" || got.Sites[0].Offset == 0 || got.Sites[0].Type != "FUNC" {
		t.Errorf("JSON = %+v", got)
	}
}
