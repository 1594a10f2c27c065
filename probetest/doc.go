// Package probetest helps a go test suite that attaches real probes to
// real processes, on a developer's machine and on a privileged CI runner,
// as package net/http/httptest helps one that serves HTTP.
//
// A test states what it needs with [RequireBPF] or [RequireFeature]: on a
// developer's machine without it the test skips, and under CI=true (see
// [InCI]) it fails, naming what is missing, so that a CI run that could not
// load a single program is not green. [Start] runs a command stopped at its
// first instruction, so that the probes are attached before it makes a
// call, and [Process.Resume] lets it go; [Process.Wait] returns its exit
// status as a shell reports it. [CBuild] compiles C targets once per
// content and flags, cached across test runs. [CheckLeaks] checks, when
// the test ends, that it left no file descriptor open and no kernel link
// of its programs attached; [CheckCounts] compares per-site counts that a
// BPF program kept by cookie with what the test expected, by site name.
//
// Everything here runs as root (or with CAP_BPF, CAP_PERFMON and
// CAP_SYS_PTRACE): the functions that need it say so.
package probetest
