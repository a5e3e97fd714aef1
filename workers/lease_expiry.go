package workers

import (
	"context"
	"time"

	"github.com/riverqueue/river"

	"github.com/flowfabric/ffreconcile/internal/coalesce"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
)

// LeaseExpiry releases attempts whose lease lapsed, so another worker can
// reclaim the execution: FlowFabric's lease_expiry reconciler, every 1.5 s.
// In a fleet that also runs AttemptTimeout it leaves the leases of active
// executions declaring retries to it (store.ExpiredLeasesShare).
var LeaseExpiry = define[jobs.LeaseExpiryTickArgs, jobs.LeaseExpiryScanArgs](Reconciler{
	Name:      "lease_expiry",
	Interval:  1500 * time.Millisecond,
	Due:       store.ExpiredLeases,
	Shares:    &Share{With: "attempt_timeout", Due: store.ExpiredLeasesShare},
	Tables:    []string{"ff_attempt", "ff_exec_core", "ff_lease_event"},
	Lookahead: true,
}, func(p int16, x store.DueRow) jobs.LeaseReleaseArgs {
	return jobs.LeaseReleaseArgs{Partition: p, ExecutionID: x.ID, AttemptIndex: x.N}
}, func(d *deps) river.Worker[jobs.LeaseReleaseArgs] {
	return &leaseReleaseWorker{d: d, releases: batcher(d, func(ctx context.Context, p int16, refs []store.LeaseRef) ([]store.ReleaseResult, error) {
		return store.ReleaseExpiredLeases(ctx, d.cfg.Pool, p, refs, store.NowMs(), d.cfg.Filter)
	})}
})

// leaseReleaseWorker releases one expired lease.
type leaseReleaseWorker struct {
	rowDefaults[jobs.LeaseReleaseArgs]
	d        *deps
	releases *coalesce.Coalescer[int16, store.LeaseRef, store.ReleaseResult]
}

func (w *leaseReleaseWorker) Work(ctx context.Context, job *river.Job[jobs.LeaseReleaseArgs]) error {
	a := job.Args
	res, logs, ok, err := act(ctx, w.d, rowAction[store.LeaseRef, store.ReleaseResult]{
		r: LeaseExpiry, job: job.JobRow, partition: a.Partition, deadlineMs: jobDeadlineMs(job.JobRow, a.DeadlineMs),
		co: w.releases, key: store.LeaseRef{ExecutionID: a.ExecutionID, AttemptIndex: a.AttemptIndex},
		changed: func(r store.ReleaseResult) bool { return r.Released },
		found:   func(r store.ReleaseResult) int64 { return r.DeadlineMs },
		row:     store.DueRow{ID: a.ExecutionID, N: a.AttemptIndex},
		noop:    "lease no longer expired under lock; nothing changed",
		attrs:   []any{"execution_id", a.ExecutionID, "attempt_index", a.AttemptIndex},
	})
	if !ok {
		return err
	}
	switch {
	case res.ExecMissing:
		logs.proc.Warn("released expired lease of an attempt whose execution row is missing", "event_id", res.EventID)
	case res.RawFieldsMalformed:
		logs.proc.Warn("released expired lease; execution raw_fields is not a JSON object, left unchanged", "event_id", res.EventID)
	default:
		logs.proc.Debug("released expired lease", "execution_flipped", res.ExecFlipped, "event_id", res.EventID)
	}
	logs.job.Info("released expired lease", "execution_flipped", res.ExecFlipped, "execution_missing", res.ExecMissing)
	return nil
}
