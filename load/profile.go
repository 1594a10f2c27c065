package load

import (
	"fmt"
	"time"
)

// Order is the order in which programs start verifying.
type Order int

const (
	// OrderLPT starts the program with the most instructions first (longest
	// processing time first). It is the default.
	OrderLPT Order = iota
	// OrderGiven starts programs in job order: the order of the slice given
	// to [Programs], or by name for a [Collection].
	OrderGiven
	// OrderCached is OrderLPT with the costs measured by an earlier start,
	// from [Options.Costs]; programs the cache does not know are estimated
	// from their instruction count.
	OrderCached
)

var orderNames = [...]string{OrderLPT: "lpt", OrderGiven: "given", OrderCached: "cached"}

// String returns the order's name as [ParseOrder] accepts it.
func (o Order) String() string {
	if o >= 0 && int(o) < len(orderNames) {
		return orderNames[o]
	}
	return fmt.Sprintf("Order(%d)", int(o))
}

// MarshalText encodes the order by name, for JSON profiles.
func (o Order) MarshalText() ([]byte, error) { return []byte(o.String()), nil }

// UnmarshalText decodes an order by name.
func (o *Order) UnmarshalText(b []byte) error {
	v, err := ParseOrder(string(b))
	if err != nil {
		return err
	}
	*o = v
	return nil
}

// ParseOrder returns the order named s: "lpt", "given" or "cached".
func ParseOrder(s string) (Order, error) {
	for i, n := range orderNames {
		if n == s {
			return Order(i), nil
		}
	}
	return 0, fmt.Errorf("unknown load order %q (want lpt, given or cached)", s)
}

// Profile describes one load phase: what each program cost and how well the
// schedule used the CPUs.
type Profile struct {
	// Jobs is the number of loads allowed at once.
	Jobs int `json:"jobs"`
	// CPUs is min(Jobs, GOMAXPROCS, NumCPU): the parallelism the lower bound
	// assumes.
	CPUs int `json:"cpus"`
	// Order is the order the programs started in.
	Order Order `json:"order"`
	// Programs describes every program, in job order.
	Programs []ProgramProfile `json:"programs"`
	// Skipped names programs of unspecified type, which are not loaded
	// (sub-programs and sections the ELF reader did not recognise).
	Skipped []string `json:"skipped,omitempty"`
	// MapCopies lists, for every tail-call map that
	// [Options.SplitTailCallMaps] split, each copy and the programs that
	// got it.
	MapCopies []MapCopy `json:"map_copies,omitempty"`

	// BTF is the time spent parsing kernel BTF, once, before the loads.
	BTF time.Duration `json:"btf_ns"`
	// Maps is the time spent creating the maps, before the loads.
	Maps time.Duration `json:"maps_ns"`
	// Makespan is the wall time from the first load's start to the last
	// load's end.
	Makespan time.Duration `json:"makespan_ns"`
	// Work is the sum of every load's wall time: what loading them one by
	// one would have taken.
	Work time.Duration `json:"work_ns"`
	// Longest is the longest single load.
	Longest time.Duration `json:"longest_ns"`
	// LowerBound is max(Longest, Work/CPUs): no schedule on CPUs processors
	// can finish sooner.
	LowerBound time.Duration `json:"lower_bound_ns"`
	// Total is the wall time of the whole call, maps and BTF included.
	Total time.Duration `json:"total_ns"`

	// CostCacheError is why saving [Options.Costs] failed, if it did; the
	// load itself is unaffected.
	CostCacheError string `json:"cost_cache_error,omitempty"`
}

// Ratio returns Makespan / LowerBound: 1 is a perfect schedule.
func (p *Profile) Ratio() float64 {
	if p.LowerBound <= 0 {
		return 0
	}
	return float64(p.Makespan) / float64(p.LowerBound)
}

// Speedup returns Work / Makespan: how much faster than loading one by one.
func (p *Profile) Speedup() float64 {
	if p.Makespan <= 0 {
		return 0
	}
	return float64(p.Work) / float64(p.Makespan)
}

// Failed returns the number of programs that failed to load.
func (p *Profile) Failed() int {
	n := 0
	for _, pp := range p.Programs {
		if pp.Err != nil {
			n++
		}
	}
	return n
}

// ProgramProfile describes the load of one program.
type ProgramProfile struct {
	// Name is the program's name.
	Name string `json:"name"`
	// Type is the program type.
	Type string `json:"type"`
	// AttachType is the expected attach type the program was loaded with
	// ("none" for none).
	AttachType string `json:"attach_type"`
	// Instructions is the static instruction count, the default cost.
	Instructions int `json:"insns"`
	// Verified is the number of instructions the verifier processed, its
	// measure of the states it explored (0 if the kernel does not say).
	Verified uint32 `json:"verified_insns"`
	// Cached tells whether a cost cache entry ranked the program.
	Cached bool `json:"cached"`
	// Rank is the program's position in the start order, from 0.
	Rank int `json:"rank"`
	// Worker is the pool slot, from 0 to Jobs-1, that loaded the program.
	Worker int `json:"worker"`
	// Start and End are the load's start and end since the first load began.
	Start time.Duration `json:"start_ns"`
	End   time.Duration `json:"end_ns"`
	// Verify is the wall time of the successful BPF_PROG_LOAD, without
	// retries: what the cost cache records.
	Verify time.Duration `json:"verify_ns"`
	// Attempts counts the loads tried: more than one after EAGAIN, or for
	// the verifier rejection whose whole log was fetched by a second load.
	Attempts int `json:"attempts"`
	// Err is why the program failed to load, nil on success.
	Err error `json:"-"`
	// Error is Err's text, for JSON.
	Error string `json:"error,omitempty"`
}

// Wall returns End - Start: the load's wall time, retries included.
func (pp *ProgramProfile) Wall() time.Duration { return pp.End - pp.Start }
