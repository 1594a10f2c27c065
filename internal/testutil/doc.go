// Package testutil holds what the test suites of several multiprobe packages
// share: the rule that decides whether a test that needs root or BPF skips
// (on a developer's machine) or fails (in CI), and small process helpers.
package testutil
