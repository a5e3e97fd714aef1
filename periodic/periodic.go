// Package periodic defines the River periodic jobs of the fleet: one tick per
// enabled reconciler. River runs periodic jobs on the elected leader only, so
// every process registers the same set and whichever leads ticks.
package periodic

import (
	"fmt"
	"time"

	"github.com/riverqueue/river"

	"github.com/flowfabric/ffreconcile/jobs"
)

// DefaultIntervals are FlowFabric's own schedule on Postgres (lease expiry
// 1.5 s, suspension timeout 2 s, sibling-cancel dispatch 1 s, its reconciler
// 10 s) plus a 1 s delayed-promotion sweep, which FlowFabric does not run.
var DefaultIntervals = map[string]time.Duration{
	jobs.ReconcilerLeaseExpiry:       1500 * time.Millisecond,
	jobs.ReconcilerSuspensionTimeout: 2 * time.Second,
	jobs.ReconcilerDelayedPromotion:  time.Second,
	jobs.ReconcilerCancelDispatch:    time.Second,
	jobs.ReconcilerCancelReconcile:   10 * time.Second,
}

// MinInterval is the shortest tick interval accepted: River refuses
// ByPeriod uniqueness under a second and advises periodic intervals of at
// least that. Shorter ticks would only add idle cost anyway: a backlog is
// drained by scans continuing themselves, not by ticks.
const MinInterval = time.Second

func tickArgs(reconciler string) (river.JobArgs, error) {
	switch reconciler {
	case jobs.ReconcilerLeaseExpiry:
		return jobs.LeaseExpiryTickArgs{}, nil
	case jobs.ReconcilerSuspensionTimeout:
		return jobs.SuspensionTimeoutTickArgs{}, nil
	case jobs.ReconcilerDelayedPromotion:
		return jobs.DelayedPromotionTickArgs{}, nil
	case jobs.ReconcilerCancelDispatch:
		return jobs.CancelDispatchTickArgs{}, nil
	case jobs.ReconcilerCancelReconcile:
		return jobs.CancelReconcileTickArgs{}, nil
	}
	return nil, fmt.Errorf("unknown reconciler %q (known: %v)", reconciler, jobs.Reconcilers)
}

// Jobs returns the periodic tick of each reconciler in enabled, run every
// interval and once at start (RunOnStart, so a new leader does not wait a
// whole interval). Ticks are unique per interval period, so a leader change
// in mid-period neither skips nor doubles one.
func Jobs(enabled map[string]time.Duration) ([]*river.PeriodicJob, error) {
	var out []*river.PeriodicJob
	for _, name := range jobs.Reconcilers {
		interval, ok := enabled[name]
		if !ok {
			continue
		}
		if interval < MinInterval {
			return nil, fmt.Errorf("%s interval %s is too short (minimum %s)", name, interval, MinInterval)
		}
		args, err := tickArgs(name)
		if err != nil {
			return nil, err
		}
		out = append(out, river.NewPeriodicJob(
			river.PeriodicInterval(interval),
			func() (river.JobArgs, *river.InsertOpts) { return args, jobs.TickInsertOpts(interval) },
			&river.PeriodicJobOpts{ID: "ff." + name + ".tick", RunOnStart: true},
		))
	}
	for name := range enabled {
		if _, err := tickArgs(name); err != nil {
			return nil, err
		}
	}
	return out, nil
}
