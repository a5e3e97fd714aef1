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
var LeaseExpiry = define[jobs.LeaseExpiryTickArgs, jobs.LeaseExpiryScanArgs](Reconciler{
	Name:      "lease_expiry",
	Interval:  1500 * time.Millisecond,
	Due:       store.ExpiredLeases,
	Lookahead: true,
}, func(p int16, x store.DueRow) jobs.LeaseReleaseArgs {
	return jobs.LeaseReleaseArgs{Partition: p, ExecutionID: x.ID, AttemptIndex: x.N, DeadlineMs: x.AtMs}
}, func(d *deps) river.Worker[jobs.LeaseReleaseArgs] {
	return &leaseReleaseWorker{d: d, releases: batcher(d, func(ctx context.Context, p int16, refs []store.LeaseRef) ([]store.ReleaseResult, error) {
		return store.ReleaseExpiredLeases(ctx, d.cfg.Pool, p, refs, store.NowMs())
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
	c := w.d.stats(LeaseExpiry)
	if err := w.d.beforeDeadline(LeaseExpiry, a.DeadlineMs); err != nil {
		return err
	}
	res, err := w.releases.Do(ctx, a.Partition, store.LeaseRef{ExecutionID: a.ExecutionID, AttemptIndex: a.AttemptIndex})
	if err != nil {
		c.Errors.Add(1)
		return err
	}
	log := w.d.log().With("reconciler", LeaseExpiry.Name, "partition", a.Partition,
		"execution_id", a.ExecutionID, "attempt_index", a.AttemptIndex, "job_id", job.ID)
	if !res.Released {
		c.NoOps.Add(1)
		log.Debug("lease no longer expired; nothing to do")
		jobLog(ctx).Info("lease no longer expired under lock; nothing changed", "partition", a.Partition,
			"execution_id", a.ExecutionID, "attempt_index", a.AttemptIndex)
		return nil
	}
	w.d.applied(LeaseExpiry, a.DeadlineMs)
	switch {
	case res.ExecMissing:
		log.Warn("released expired lease of an attempt whose execution row is missing", "event_id", res.EventID)
	case res.RawFieldsMalformed:
		log.Warn("released expired lease; execution raw_fields is not a JSON object, left unchanged", "event_id", res.EventID)
	default:
		log.Debug("released expired lease", "execution_flipped", res.ExecFlipped, "event_id", res.EventID)
	}
	jobLog(ctx).Info("released expired lease", "partition", a.Partition, "execution_id", a.ExecutionID,
		"attempt_index", a.AttemptIndex, "execution_flipped", res.ExecFlipped, "execution_missing", res.ExecMissing,
		"lease_event_id", res.EventID)
	return nil
}
