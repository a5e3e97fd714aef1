package workers

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
)

func registerSuspensionTimeout(ws *river.Workers, d *deps) error {
	if err := addWorker(ws, d, &suspensionTimeoutTickWorker{d: d}); err != nil {
		return err
	}
	if err := addWorker(ws, d, &suspensionTimeoutScanWorker{d: d}); err != nil {
		return err
	}
	return addWorker(ws, d, &suspensionExpireWorker{d: d})
}

// suspensionTimeoutTickWorker finds the partitions holding timed-out
// suspensions and enqueues one scan for each.
type suspensionTimeoutTickWorker struct {
	river.WorkerDefaults[jobs.SuspensionTimeoutTickArgs]
	d *deps
}

func (w *suspensionTimeoutTickWorker) Timeout(*river.Job[jobs.SuspensionTimeoutTickArgs]) time.Duration {
	return TickTimeout
}

func (w *suspensionTimeoutTickWorker) Work(ctx context.Context, _ *river.Job[jobs.SuspensionTimeoutTickArgs]) error {
	return w.d.tick(ctx, river.ClientFromContext[pgx.Tx](ctx), SuspensionTimeout)
}

var suspensionScan = &scanSpec[store.ExpiredSuspension]{
	name:       SuspensionTimeout,
	scan:       store.ScanExpiredSuspensions,
	deadlineMs: func(s store.ExpiredSuspension) int64 { return s.TimeoutAtMs },
	key:        func(s store.ExpiredSuspension) string { return s.ExecutionID },
	rowJob: func(p int16, s store.ExpiredSuspension) river.JobArgs {
		return jobs.SuspensionExpireArgs{Partition: p, ExecutionID: s.ExecutionID, DeadlineMs: s.TimeoutAtMs}
	},
	cursor: func(s store.ExpiredSuspension) jobs.ScanCursor {
		return jobs.ScanCursor{AtMs: s.TimeoutAtMs, ID: s.ExecutionID}
	},
	next: func(p int16, after *jobs.ScanCursor, follows int64) river.JobArgs {
		return jobs.SuspensionTimeoutScanArgs{Partition: p, After: after, Follows: follows}
	},
}

// suspensionTimeoutScanWorker enqueues one expire job per timed-out
// suspension of a partition.
type suspensionTimeoutScanWorker struct {
	river.WorkerDefaults[jobs.SuspensionTimeoutScanArgs]
	d *deps
}

func (w *suspensionTimeoutScanWorker) Timeout(*river.Job[jobs.SuspensionTimeoutScanArgs]) time.Duration {
	return ScanTimeout
}

func (w *suspensionTimeoutScanWorker) Work(ctx context.Context, job *river.Job[jobs.SuspensionTimeoutScanArgs]) error {
	return runScan(ctx, w.d, suspensionScan, job, job.Args.Partition, job.Args.After, job.Args.Follows)
}

// suspensionExpireWorker applies the timeout behaviour of one suspension.
type suspensionExpireWorker struct {
	river.WorkerDefaults[jobs.SuspensionExpireArgs]
	d *deps
}

func (w *suspensionExpireWorker) Timeout(*river.Job[jobs.SuspensionExpireArgs]) time.Duration {
	return RowTimeout
}

func (w *suspensionExpireWorker) Work(ctx context.Context, job *river.Job[jobs.SuspensionExpireArgs]) error {
	a := job.Args
	c := w.d.cfg.Stats.For(SuspensionTimeout)
	if err := w.d.beforeDeadline(SuspensionTimeout, a.DeadlineMs); err != nil {
		return err
	}
	res, err := w.d.suspensions.Do(ctx, a.Partition, a.ExecutionID)
	if err != nil {
		c.Errors.Add(1)
		return err
	}
	log := w.d.log().With("reconciler", SuspensionTimeout, "partition", a.Partition,
		"execution_id", a.ExecutionID, "job_id", job.ID)
	if !res.Applied {
		c.NoOps.Add(1)
		log.Debug("suspension resolved or timeout no longer lapsed; nothing to do")
		jobLog(ctx).Info("suspension resolved or timeout no longer lapsed under lock; nothing changed",
			"partition", a.Partition, "execution_id", a.ExecutionID)
		return nil
	}
	w.d.applied(SuspensionTimeout, a.DeadlineMs)
	jobLog(ctx).Info("suspension timed out", "partition", a.Partition, "execution_id", a.ExecutionID,
		"timeout_behavior", res.Behavior, "action", res.Action, "completion_event_id", res.EventID,
		"execution_missing", res.ExecMissing)
	log = log.With("timeout_behavior", res.Behavior, "action", res.Action)
	if res.UnknownBehavior {
		log.Warn("unknown suspension timeout behaviour; applied as fail")
	}
	if res.Action == store.TimeoutAutoResume {
		switch {
		case res.MemberMapReplaced != "":
			log.Warn("suspension member_map was not a JSON object; replaced by one holding only the timeout signal",
				"replaced_member_map", truncate(res.MemberMapReplaced, 512))
		case res.TimeoutEntryNotArray != "":
			log.Warn("suspension member_map.__timeout__ is not an array; kept as is and the timeout signal dropped (timeout cleared)",
				"timeout_entry_type", res.TimeoutEntryNotArray)
		default:
			log.Debug("suspension timed out; timeout signal delivered", "timeout_signals", res.TimeoutSignals)
		}
		return nil
	}
	switch {
	case res.ExecMissing:
		log.Warn("timed-out suspension of an execution whose row is missing: suspension deleted, no completion event written")
	case res.RawFieldsMalformed:
		log.Warn("suspension timed out; execution raw_fields is not a JSON object, left unchanged",
			"outcome", res.Outcome, "event_id", res.EventID)
	default:
		log.Debug("suspension timed out; execution terminal", "outcome", res.Outcome, "event_id", res.EventID)
	}
	return nil
}

// truncate shortens s to at most n bytes for a log line.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
