// Package periodic defines the River periodic jobs of the fleet: one tick per
// enabled reconciler, and the outbox trim when it is on. River runs periodic jobs on the elected leader only, so
// every process registers the same set and whichever leads ticks.
package periodic

import (
	"fmt"
	"slices"
	"time"

	"github.com/riverqueue/river"

	"github.com/flowfabric/ffreconcile/jobs"
)

// MinInterval is the shortest tick interval accepted: River refuses
// ByPeriod uniqueness under a second and advises periodic intervals of at
// least that. Shorter ticks would only add idle cost anyway: a backlog is
// drained by scans continuing themselves, not by ticks.
const MinInterval = time.Second

// Tick is one reconciler's periodic tick.
type Tick struct {
	// Args are the tick's args; their kind names the periodic job.
	Args river.JobArgs
	// Interval is how often it runs.
	Interval time.Duration
	// InsertOpts are its insert options. Defaults to jobs.TickInsertOpts().
	InsertOpts *river.InsertOpts
}

// Jobs returns a periodic job for each tick, run every interval and once at
// start (RunOnStart, so a new leader does not wait a whole interval). Ticks
// are unique by state only (jobs.TickInsertOpts: at most one unfinished tick
// per reconciler), not per interval period: a new leader's first tick joins
// its predecessor's last if that one is still unfinished, and otherwise runs
// at once, which costs a probe (a tick is idempotent).
func Jobs(ticks []Tick) ([]*river.PeriodicJob, error) {
	out := make([]*river.PeriodicJob, 0, len(ticks))
	seen := map[string]bool{}
	for _, t := range ticks {
		kind := t.Args.Kind()
		if seen[kind] {
			return nil, fmt.Errorf("tick %s given twice", kind)
		}
		seen[kind] = true
		if t.Interval < MinInterval {
			return nil, fmt.Errorf("%s interval %s is too short (minimum %s)", kind, t.Interval, MinInterval)
		}
		args, interval, opts := t.Args, t.Interval, t.insertOpts()
		out = append(out, river.NewPeriodicJob(
			river.PeriodicInterval(interval),
			func() (river.JobArgs, *river.InsertOpts) { o := *opts; return args, &o },
			&river.PeriodicJobOpts{ID: kind, RunOnStart: true},
		))
	}
	return out, nil
}

// insertOpts returns the tick's insert options, jobs.TickInsertOpts() unless
// it has its own.
func (t Tick) insertOpts() *river.InsertOpts {
	if t.InsertOpts != nil {
		return t.InsertOpts
	}
	return jobs.TickInsertOpts()
}

// StartNow returns each tick as insert params, tagged tag, to run at once:
// what a new leader's periodic jobs insert with RunOnStart, for a process
// that knows the leadership changed hands before River's new leader gets to
// it. River's maintenance services start one after another, each after a
// random pause of up to a second, so its periodic jobs start 0-6 s after
// the election (docs/design.md, "Leader failover"). Each tick keeps its
// uniqueness among unfinished jobs, so a tick already waiting is not
// doubled and the new leader's own RunOnStart adds at most one more probe.
func StartNow(ticks []Tick, tag string) []river.InsertManyParams {
	out := make([]river.InsertManyParams, 0, len(ticks))
	for _, t := range ticks {
		opts := *t.insertOpts()
		opts.Tags = append(slices.Clip(opts.Tags), tag)
		out = append(out, river.InsertManyParams{Args: t.Args, InsertOpts: &opts})
	}
	return out
}
