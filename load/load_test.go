package load

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/multiprobe/multiprobe/internal/testutil"
	"github.com/multiprobe/multiprobe/probetest"
)

// smallSet returns n cheap programs sharing map "shared".
func smallSet(n int) []*ebpf.ProgramSpec {
	specs := make([]*ebpf.ProgramSpec, n)
	for i := range specs {
		specs[i] = skewedProgram(fmt.Sprintf("small%02d", i), 10+i, 10+i, 1)
	}
	return specs
}

// runSocketFilter runs prog once on a minimal packet and returns its result,
// proving the kernel holds a working program.
func runSocketFilter(t *testing.T, prog *ebpf.Program) uint32 {
	t.Helper()
	ret, err := prog.Run(&ebpf.RunOptions{Data: make([]byte, 14)})
	if err != nil {
		t.Fatalf("run %v: %v", prog, err)
	}
	return ret
}

func TestBoundRespected(t *testing.T) {
	probetest.RequireBPF(t)
	for _, jobs := range []int{1, 2, 3, 8} {
		t.Run(fmt.Sprint(jobs), func(t *testing.T) {
			var inFlight, peak atomic.Int32
			var reached atomic.Bool
			deadline := time.Now().Add(10 * time.Second)
			opts := &Options{Jobs: jobs, hook: func(name string, attempt int, _ ebpf.ProgramOptions, load func() (*ebpf.Program, error)) (*ebpf.Program, error) {
				n := inFlight.Add(1)
				defer inFlight.Add(-1)
				for {
					p := peak.Load()
					if n <= p || peak.CompareAndSwap(p, n) {
						break
					}
				}
				// Hold the slot until the others have piled up: a
				// fixed pause was too short under emulation (7 of 8).
				for !reached.Load() && time.Now().Before(deadline) {
					if inFlight.Load() >= int32(jobs) {
						reached.Store(true)
						break
					}
					time.Sleep(100 * time.Microsecond)
				}
				return load()
			}}
			coll, prof, err := Collection(collectionOf(smallSet(12)), opts)
			if err != nil {
				t.Fatal(err)
			}
			defer coll.Close()
			if got := peak.Load(); got != int32(jobs) {
				t.Errorf("peak concurrent loads = %d, want exactly %d", got, jobs)
			}
			// The profile agrees: no instant has more than jobs loads.
			for _, a := range prof.Programs {
				overlap := 0
				for _, b := range prof.Programs {
					if b.Start <= a.Start && a.Start < b.End {
						overlap++
					}
				}
				if overlap > jobs {
					t.Errorf("%d loads at %v, want at most %d", overlap, a.Start, jobs)
				}
				if a.Worker < 0 || a.Worker >= jobs {
					t.Errorf("%s: worker %d out of [0,%d)", a.Name, a.Worker, jobs)
				}
			}
			if len(coll.Programs) != 12 {
				t.Fatalf("got %d programs, want 12", len(coll.Programs))
			}
			for name, p := range coll.Programs {
				if ret := runSocketFilter(t, p); ret != 0 {
					t.Errorf("%s returned %d, want 0", name, ret)
				}
			}
		})
	}
}

func TestProfileConsistent(t *testing.T) {
	probetest.RequireBPF(t)
	specs := smallSet(6)
	specs[4] = skewedProgram("big", 200, 40, 2)
	coll, prof, err := Collection(collectionOf(specs), &Options{Jobs: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer coll.Close()

	// LPT: the biggest program by instruction count starts first.
	if pp := prof.Programs[0]; pp.Name != "big" || pp.Rank != 0 {
		t.Errorf("first job %s has rank %d; want big with rank 0", pp.Name, pp.Rank)
	}
	var work, longest time.Duration
	first, last := prof.Programs[0].Start, time.Duration(0)
	ranks := map[int]bool{}
	counted := testutil.KernelCountsVerified(t)
	for _, pp := range prof.Programs {
		work += pp.Wall()
		longest = max(longest, pp.Wall())
		first, last = min(first, pp.Start), max(last, pp.End)
		ranks[pp.Rank] = true
		// Kernels before 5.16 do not count verified instructions.
		if (counted && pp.Verified < uint32(pp.Instructions)/2) || pp.Attempts != 1 || pp.Verify <= 0 {
			t.Errorf("%s: verified %d of %d insns in %v, %d attempts", pp.Name, pp.Verified, pp.Instructions, pp.Verify, pp.Attempts)
		}
	}
	if prof.Work != work || prof.Longest != longest || prof.Makespan != last-first {
		t.Errorf("profile work %v longest %v makespan %v; programs say %v %v %v", prof.Work, prof.Longest, prof.Makespan, work, longest, last-first)
	}
	if want := max(longest, work/time.Duration(prof.CPUs)); prof.LowerBound != want {
		t.Errorf("lower bound %v, want %v", prof.LowerBound, want)
	}
	if len(ranks) != len(prof.Programs) {
		t.Errorf("ranks %v are not a permutation", ranks)
	}
	if prof.Makespan < prof.LowerBound {
		t.Errorf("makespan %v below the lower bound %v", prof.Makespan, prof.LowerBound)
	}
}

// failingSet has bad programs at jobs 1, 4 and 6 (name order) and asks the
// hook to fail job 3 without touching the kernel.
func failingSet() []*ebpf.ProgramSpec {
	specs := smallSet(8)
	for _, i := range []int{1, 4, 6} {
		specs[i] = badProgram(specs[i].Name)
	}
	return specs
}

var errInjected = errors.New("injected failure")

func TestErrorReportDeterministic(t *testing.T) {
	probetest.RequireBPF(t)

	var first string
	for run := range 6 {
		var mu sync.Mutex
		logged := map[string][]ebpf.LogLevel{} // program -> log level per attempt
		opts := &Options{Jobs: 1 + run%4, Order: Order(run % 2), hook: func(name string, attempt int, popts ebpf.ProgramOptions, load func() (*ebpf.Program, error)) (*ebpf.Program, error) {
			mu.Lock()
			logged[name] = append(logged[name], popts.LogLevel)
			mu.Unlock()
			// Shuffle completion order from run to run.
			time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
			if name == "small03" {
				return nil, errInjected
			}
			return load()
		}}
		coll, prof, err := Collection(collectionOf(failingSet()), opts)
		if coll != nil {
			coll.Close()
			t.Fatal("got a collection despite failures")
		}
		var lerr *Error
		if !errors.As(err, &lerr) {
			t.Fatalf("error %v is not a *load.Error", err)
		}
		var names []string
		for _, f := range lerr.Failures {
			names = append(names, f.Program)
		}
		if want := []string{"small01", "small03", "small04", "small06"}; !slices.Equal(names, want) {
			t.Fatalf("failures %v, want %v in job order", names, want)
		}
		if !errors.Is(err, errInjected) {
			t.Error("errors.Is(err, injected) = false")
		}
		var ve *ebpf.VerifierError
		if !errors.As(err, &ve) {
			t.Error("no VerifierError in the report")
		}
		if run == 0 {
			first = err.Error()
		} else if err.Error() != first {
			t.Fatalf("run %d reported\n%s\nrun 0 reported\n%s", run, err, first)
		}
		if prof == nil || prof.Failed() != 4 {
			t.Fatalf("profile reports %d failures, want 4", prof.Failed())
		}
		// Statistics only on a first try; only the first rejection (small01)
		// is loaded again, with the whole log.
		for name, levels := range logged {
			want := []ebpf.LogLevel{ebpf.LogLevelStats}
			if name == "small01" {
				want = append(want, ebpf.LogLevelBranch|ebpf.LogLevelStats)
			}
			if !slices.Equal(levels, want) {
				t.Errorf("%s: log levels per attempt %v, want %v", name, levels, want)
			}
		}
		for _, f := range lerr.Failures {
			if want := f.Program != "small03"; f.Rejected != want || f.AfterVerification {
				t.Errorf("%s: rejected %v after verification %v, want rejected %v", f.Program, f.Rejected, f.AfterVerification, want)
			}
		}
		// The others' messages are there, without their logs.
		for _, want := range []string{"program small04: rejected by the verifier: ", "R0 !read_ok", "whole verifier logs of small04, small06: add them to load.Options.VerifierLogs"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("report lacks %q:\n%s", want, err)
			}
		}
	}

	// The first failure carries its whole verifier log, the others do not.
	log := lerrLog(t, "small01")
	if len(log) < 2 {
		t.Fatalf("verifier log of small01 has %d lines", len(log))
	}
	for _, line := range log {
		if !strings.Contains(first, "\n\t"+line) {
			t.Errorf("report misses log line %q", line)
		}
	}
	if n := strings.Count(first, "verifier log of program"); n != 1 {
		t.Errorf("report has %d whole logs, want 1:\n%s", n, first)
	}
	if !strings.HasPrefix(first, "4 of 8 programs failed to load\nprogram small01: rejected by the verifier: ") {
		t.Errorf("report starts %q", first[:min(len(first), 80)])
	}
}

// lerrLog returns the verifier log the kernel gives bad program name.
func lerrLog(t *testing.T, name string) []string {
	_, err := ebpf.NewProgram(badProgram(name))
	var ve *ebpf.VerifierError
	if !errors.As(err, &ve) {
		t.Fatalf("bad program loaded: %v", err)
	}
	return ve.Log
}

func TestEAGAINRetried(t *testing.T) {
	probetest.RequireBPF(t)
	opts := &Options{hook: func(name string, attempt int, popts ebpf.ProgramOptions, load func() (*ebpf.Program, error)) (*ebpf.Program, error) {
		if name == "small02" && attempt < 3 {
			if popts.LogLevel != ebpf.LogLevelStats {
				t.Errorf("attempt %d after EAGAIN asked for log level %v, want statistics", attempt, popts.LogLevel)
			}
			return nil, fmt.Errorf("load program: %w", syscall.EAGAIN)
		}
		return load()
	}}
	progs, prof, err := Programs(smallSet(4), mapsFor(t), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(progs)
	if pp := prof.Programs[2]; pp.Attempts != 4 || pp.Err != nil {
		t.Errorf("small02: %d attempts, err %v; want 4 and nil", pp.Attempts, pp.Err)
	}
	runSocketFilter(t, progs["small02"])
}

// mapsFor creates map "shared" for Programs.
func mapsFor(t *testing.T) map[string]*ebpf.Map {
	t.Helper()
	m, err := ebpf.NewMap(sharedMapSpec())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return map[string]*ebpf.Map{"shared": m}
}

func TestNothingLeaked(t *testing.T) {
	probetest.RequireBPF(t)
	spec := tailCallSpec(ebpf.AttachNone)
	for _, p := range failingSet() {
		spec.Programs[p.Name] = p
	}
	// Warm up cilium's feature probes, which keep nothing open but run once.
	if coll, _, err := Collection(collectionOf(smallSet(2)), nil); err == nil {
		coll.Close()
	}
	shared := mapsFor(t)

	before, err := testutil.OpenFDs()
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, _, err := Collection(spec, &Options{Jobs: 4}); err == nil {
			t.Fatal("collection with bad programs loaded")
		}
		if _, _, err := Programs(failingSet(), shared, &Options{Jobs: 3}); err == nil {
			t.Fatal("bad programs loaded")
		}
	}
	after, err := testutil.OpenFDs()
	if err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Errorf("%d fds open after failed loads, %d before", after, before)
	}
	// The caller's map is still the caller's.
	if err := shared["shared"].Put(uint32(0), uint64(7)); err != nil {
		t.Errorf("caller's map unusable after a failed load: %v", err)
	}
}

// tailCallSpec returns a collection where uprobe program "caller" tail-calls
// "callee" through PROG_ARRAY "jmp", whose contents name the callee, and
// the callee's attach type is calleeAttach.
func tailCallSpec(calleeAttach ebpf.AttachType) *ebpf.CollectionSpec {
	return &ebpf.CollectionSpec{
		Maps: map[string]*ebpf.MapSpec{
			"jmp": {Name: "jmp", Type: ebpf.ProgramArray, KeySize: 4, ValueSize: 4, MaxEntries: 2,
				Contents: []ebpf.MapKV{{Key: uint32(0), Value: "callee"}}},
			"shared": sharedMapSpec(),
		},
		Programs: map[string]*ebpf.ProgramSpec{
			"caller": {Name: "caller", Type: ebpf.Kprobe, SectionName: "uprobe/caller", License: "GPL",
				Instructions: asm.Instructions{
					asm.LoadMapPtr(asm.R2, 0).WithReference("jmp"),
					asm.Mov.Imm(asm.R3, 0),
					asm.FnTailCall.Call(),
					asm.Mov.Imm(asm.R0, 0),
					asm.Return(),
				}},
			"callee": {Name: "callee", Type: ebpf.Kprobe, SectionName: "uprobe/callee", AttachType: calleeAttach, License: "GPL",
				Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}},
		},
	}
}

func TestTailCallAttachTypes(t *testing.T) {
	probetest.RequireBPF(t)

	// Every uprobe program loads for uprobe_multi, the callee included: the
	// kernel holds both, and the tail-call map is filled after the loads.
	multi := func(_ string, spec *ebpf.ProgramSpec) ebpf.AttachType {
		if strings.HasPrefix(spec.SectionName, "uprobe") {
			return ebpf.AttachTraceUprobeMulti
		}
		return spec.AttachType
	}
	coll, _, err := Collection(tailCallSpec(ebpf.AttachNone), &Options{AttachType: multi})
	if err != nil {
		t.Fatal(err)
	}
	defer coll.Close()
	var id uint32
	if err := coll.Maps["jmp"].Lookup(uint32(0), &id); err != nil {
		t.Fatalf("jmp[0]: %v", err)
	}
	info, err := coll.Programs["callee"].Info()
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := info.ID(); ebpf.ProgramID(id) != want {
		t.Errorf("jmp[0] holds program %d, want callee %d", id, want)
	}

	// A mix is refused before anything is created, where the kernel
	// would refuse it (Linux 6.12, and stable kernels with the fix).
	if !tailCallAttachTypes() {
		t.Log("this kernel takes a mix of attach types in one prog array")
		return
	}
	before, _ := testutil.OpenFDs()
	mix := func(name string, spec *ebpf.ProgramSpec) ebpf.AttachType {
		if name == "caller" {
			return ebpf.AttachTraceUprobeMulti
		}
		return ebpf.AttachNone
	}
	_, prof, err := Collection(tailCallSpec(ebpf.AttachNone), &Options{AttachType: mix})
	if !errors.Is(err, ErrTailCallMix) || prof != nil {
		t.Fatalf("mixed attach types: err %v, profile %v; want ErrTailCallMix, nil", err, prof)
	}
	for _, want := range []string{"jmp", "callee", "caller", "Uprobe", "SplitTailCallMaps"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	if after, _ := testutil.OpenFDs(); after != before {
		t.Errorf("%d fds after a refused load, %d before", after, before)
	}
}

func TestRaceSharedMapsAndBTF(t *testing.T) {
	probetest.RequireBPF(t)
	specs := make([]*ebpf.ProgramSpec, 16)
	for i := range specs {
		specs[i] = btfProgram(fmt.Sprintf("tp_btf%02d", i))
	}
	var inFlight, peak atomic.Int32
	opts := &Options{Jobs: 16, hook: func(_ string, _ int, _ ebpf.ProgramOptions, load func() (*ebpf.Program, error)) (*ebpf.Program, error) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(5 * time.Millisecond) // let all 16 start
		return load()
	}}
	coll, prof, err := Collection(collectionOf(specs), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer coll.Close()
	if peak.Load() != 16 {
		t.Errorf("peak concurrent loads %d, want 16", peak.Load())
	}
	if prof.BTF <= 0 {
		t.Error("kernel BTF was not parsed before the loads")
	}
	mi, err := coll.Maps["shared"].Info()
	if err != nil {
		t.Fatal(err)
	}
	mapID, _ := mi.ID()
	for name, p := range coll.Programs {
		info, err := p.Info()
		if err != nil {
			t.Fatal(err)
		}
		ids, _ := info.MapIDs()
		if !slices.Contains(ids, mapID) {
			t.Errorf("%s uses maps %v, not the shared map %d", name, ids, mapID)
		}
		if info.Type != ebpf.Tracing {
			t.Errorf("%s has type %v", name, info.Type)
		}
	}
}

func TestCostCacheReorders(t *testing.T) {
	probetest.RequireBPF(t)
	costs := NewCostCache(t.TempDir() + "/costs.json")
	specs := skewedSet()
	cs := collectionOf(specs)

	coll, static, err := Collection(cs, &Options{Costs: costs})
	if err != nil {
		t.Fatal(err)
	}
	coll.Close()
	if static.CostCacheError != "" || costs.Len() != len(specs) {
		t.Fatalf("cache holds %d programs (error %q), want %d", costs.Len(), static.CostCacheError, len(specs))
	}

	reopened, err := OpenCostCache(costs.Path())
	if err != nil {
		t.Fatal(err)
	}
	coll, cached, err := Collection(cs, &Options{Costs: reopened, Order: OrderCached})
	if err != nil {
		t.Fatal(err)
	}
	coll.Close()

	// prog14 is short but loops 3000 times: by instruction count it starts
	// among the last, by measured cost before every small program.
	rank := func(p *Profile, name string) int {
		for _, pp := range p.Programs {
			if pp.Name == name {
				return pp.Rank
			}
		}
		t.Fatalf("no program %s", name)
		return 0
	}
	if r := rank(static, "prog14"); r < 15 {
		t.Errorf("static order ranks prog14 %d, want among the last", r)
	}
	if r := rank(cached, "prog14"); r > 6 {
		t.Errorf("cached order ranks prog14 %d, want among the first 6", r)
	}
	if r := rank(cached, "prog19"); r != 0 {
		t.Errorf("cached order ranks the dominant program %d, want 0", r)
	}
	for _, pp := range cached.Programs {
		if !pp.Cached {
			t.Errorf("%s was not found in the cache", pp.Name)
		}
	}
}

func TestOptionsRejected(t *testing.T) {
	tests := []struct {
		name string
		opts Options
		want string
	}{
		{"negative jobs", Options{Jobs: -1}, "jobs"},
		{"cached without cache", Options{Order: OrderCached}, "cost cache"},
		{"unknown order", Options{Order: 7}, "Order(7)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := Collection(collectionOf(smallSet(1)), &tt.opts)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err %v, want one mentioning %q", err, tt.want)
			}
		})
	}
	if _, _, err := Programs([]*ebpf.ProgramSpec{badProgram("a"), badProgram("a")}, nil, nil); err == nil {
		t.Error("duplicate names accepted")
	}
}

func TestMissingMapIsJobError(t *testing.T) {
	probetest.RequireBPF(t)
	_, prof, err := Programs(smallSet(3), nil, nil)
	var lerr *Error
	if !errors.As(err, &lerr) || len(lerr.Failures) != 3 {
		t.Fatalf("err %v, want 3 failures", err)
	}
	if !strings.Contains(err.Error(), "map shared, which is not given") {
		t.Errorf("error %q does not name the map", err)
	}
	if prof.Programs[0].Attempts != 0 {
		t.Errorf("a program with a missing map was loaded %d times", prof.Programs[0].Attempts)
	}
}

func TestCollectionFromELF(t *testing.T) {
	probetest.RequireBPF(t)
	spec, err := ebpf.LoadCollectionSpec("testdata/multi.o")
	if err != nil {
		t.Fatal(err)
	}
	spec.Maps["seen"].MaxEntries = 1
	spec.Maps["events"].MaxEntries = 1 << 16
	var objs struct {
		Count  *ebpf.Program `ebpf:"count_packets"`
		Counts *ebpf.Map     `ebpf:"counts"`
		// Held open: the kernel empties a PROG_ARRAY whose last fd closes.
		Jmp *ebpf.Map `ebpf:"jmp"`
	}
	prof, err := LoadAndAssign(spec, &objs, &Options{Jobs: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer objs.Count.Close()
	defer objs.Counts.Close()
	defer objs.Jmp.Close()
	if len(prof.Programs) != 5 || prof.Failed() != 0 {
		t.Fatalf("profile has %d programs, %d failed", len(prof.Programs), prof.Failed())
	}

	// count_packets bumps counts[0] and tail-calls tail_target through jmp,
	// filled after the loads, which bumps counts[1].
	runSocketFilter(t, objs.Count)
	for k, want := range []uint64{1, 1} {
		var got uint64
		if err := objs.Counts.Lookup(uint32(k), &got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("counts[%d] = %d, want %d (tail call taken?)", k, got, want)
		}
	}
}
