// Package callcount counts the calls a process makes to the functions that
// probe specs select, with one BPF program for all of them. It is the
// example of a tool built on multiprobe, and its tests the example of
// testing one with package probetest, from a module of its own.
package callcount

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/multiprobe/multiprobe"
)

// A Counter counts calls until it is closed.
type Counter struct {
	plan *multiprobe.Plan
	objs counterObjects
	link *multiprobe.Link
}

// Start resolves specs ("uprobe:/bin/bash:sh_*"), loads the counting
// program and attaches it, counting only the calls of process pid (0: of
// every process).
func Start(pid int, specs ...string) (_ *Counter, err error) {
	probes, err := multiprobe.ParseProbes(specs...)
	if err != nil {
		return nil, err
	}
	c := &Counter{}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.Close())
		}
	}()
	if c.plan, err = multiprobe.Resolve(probes, &multiprobe.Options{PID: pid}); err != nil {
		return nil, err
	}
	spec, err := loadCounter()
	if err != nil {
		return nil, err
	}
	// Before loading: the plan sets the attach type, and on kernels that
	// need them the pid filter and the per-site cookies.
	if err := c.plan.Prepare(spec); err != nil {
		return nil, err
	}
	spec.Maps["counts"].MaxEntries = uint32(max(c.plan.Len(), 1))
	if err := spec.LoadAndAssign(&c.objs, nil); err != nil {
		return nil, fmt.Errorf("callcount: loading the counter: %w", err)
	}
	if c.link, err = c.plan.Attach(c.objs.CountCall); err != nil {
		return nil, err
	}
	return c, nil
}

// Sites are the sites counted, each at the index of its count.
func (c *Counter) Sites() []multiprobe.Site { return c.plan.Sites() }

// Counts is the map of counts, indexed by site.
func (c *Counter) Counts() *ebpf.Map { return c.objs.Counts }

// Close detaches the program and releases everything.
func (c *Counter) Close() error {
	var errs []error
	if c.link != nil {
		errs = append(errs, c.link.Close())
	}
	errs = append(errs, c.objs.Close())
	if c.plan != nil {
		errs = append(errs, c.plan.Close())
	}
	return errors.Join(errs...)
}
