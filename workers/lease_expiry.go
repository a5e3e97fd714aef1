package workers

import (
	"context"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
)

func registerLeaseExpiry(ws *river.Workers, d *deps) error {
	if err := addWorker(ws, d, &leaseExpiryTickWorker{d: d}); err != nil {
		return err
	}
	if err := addWorker(ws, d, &leaseExpiryScanWorker{d: d}); err != nil {
		return err
	}
	return addWorker(ws, d, &leaseReleaseWorker{d: d})
}

// leaseExpiryTickWorker finds the partitions holding expired leases and
// enqueues one scan for each.
type leaseExpiryTickWorker struct {
	river.WorkerDefaults[jobs.LeaseExpiryTickArgs]
	d *deps
}

func (w *leaseExpiryTickWorker) Timeout(*river.Job[jobs.LeaseExpiryTickArgs]) time.Duration {
	return TickTimeout
}

func (w *leaseExpiryTickWorker) Work(ctx context.Context, _ *river.Job[jobs.LeaseExpiryTickArgs]) error {
	return w.d.tick(ctx, river.ClientFromContext[pgx.Tx](ctx), LeaseExpiry)
}

var leaseScan = &scanSpec[store.ExpiredLease]{
	name:       LeaseExpiry,
	scan:       store.ScanExpiredLeases,
	deadlineMs: func(l store.ExpiredLease) int64 { return l.ExpiresAtMs },
	key: func(l store.ExpiredLease) string {
		return l.ExecutionID + "/" + strconv.Itoa(int(l.AttemptIndex))
	},
	rowJob: func(p int16, l store.ExpiredLease) river.JobArgs {
		return jobs.LeaseReleaseArgs{Partition: p, ExecutionID: l.ExecutionID, AttemptIndex: l.AttemptIndex, DeadlineMs: l.ExpiresAtMs}
	},
	cursor: func(l store.ExpiredLease) jobs.ScanCursor {
		return jobs.ScanCursor{AtMs: l.ExpiresAtMs, ID: l.ExecutionID, N: l.AttemptIndex}
	},
	next: func(p int16, after *jobs.ScanCursor, follows int64) river.JobArgs {
		return jobs.LeaseExpiryScanArgs{Partition: p, After: after, Follows: follows}
	},
}

// leaseExpiryScanWorker enqueues one release job per expired lease of a
// partition.
type leaseExpiryScanWorker struct {
	river.WorkerDefaults[jobs.LeaseExpiryScanArgs]
	d *deps
}

func (w *leaseExpiryScanWorker) Timeout(*river.Job[jobs.LeaseExpiryScanArgs]) time.Duration {
	return ScanTimeout
}

func (w *leaseExpiryScanWorker) Work(ctx context.Context, job *river.Job[jobs.LeaseExpiryScanArgs]) error {
	return runScan(ctx, w.d, leaseScan, job, job.Args.Partition, job.Args.After, job.Args.Follows)
}

// leaseReleaseWorker releases one expired lease.
type leaseReleaseWorker struct {
	river.WorkerDefaults[jobs.LeaseReleaseArgs]
	d *deps
}

func (w *leaseReleaseWorker) Timeout(*river.Job[jobs.LeaseReleaseArgs]) time.Duration {
	return RowTimeout
}

func (w *leaseReleaseWorker) Work(ctx context.Context, job *river.Job[jobs.LeaseReleaseArgs]) error {
	a := job.Args
	c := w.d.cfg.Stats.For(LeaseExpiry)
	if err := w.d.beforeDeadline(LeaseExpiry, a.DeadlineMs); err != nil {
		return err
	}
	res, err := w.d.releases.Do(ctx, a.Partition, store.LeaseRef{ExecutionID: a.ExecutionID, AttemptIndex: a.AttemptIndex})
	if err != nil {
		c.Errors.Add(1)
		return err
	}
	log := w.d.log().With("reconciler", LeaseExpiry, "partition", a.Partition,
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
