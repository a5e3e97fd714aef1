package workers

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
)

// Sibling-cancel dispatch and its reconciler share the partition probe and
// the scan of ff_pending_cancel_groups; they differ in the row action. The
// tenant filter applies to a group through its downstream execution (see
// package store).

func registerCancelDispatch(ws *river.Workers, d *deps) error {
	if err := addWorker(ws, d, &cancelDispatchTickWorker{d: d}); err != nil {
		return err
	}
	if err := addWorker(ws, d, &cancelDispatchScanWorker{d: d}); err != nil {
		return err
	}
	return addWorker(ws, d, &cancelDispatchWorker{d: d})
}

func registerCancelReconcile(ws *river.Workers, d *deps) error {
	if err := addWorker(ws, d, &cancelReconcileTickWorker{d: d}); err != nil {
		return err
	}
	if err := addWorker(ws, d, &cancelReconcileScanWorker{d: d}); err != nil {
		return err
	}
	return addWorker(ws, d, &cancelReconcileWorker{d: d})
}

func groupKey(g store.PendingCancelGroup) string { return g.FlowID + "/" + g.DownstreamEID }

func groupCursor(g store.PendingCancelGroup) jobs.ScanCursor {
	return jobs.ScanCursor{AtMs: g.EnqueuedAtMs, ID: g.FlowID, ID2: g.DownstreamEID}
}

// duePendingCancelPartitions runs the probe shared by both ticks.
func duePendingCancelPartitions(ctx context.Context, d *deps) (tickWindow, error) {
	w := tickWindow{nowMs: store.NowMs()}
	parts, err := store.DuePendingCancelPartitions(ctx, d.tickDB(), d.cfg.PartitionCount, d.cfg.Filter)
	w.parts = parts
	return w, err
}

// ---- dispatch ----

// cancelDispatchTickWorker finds the partitions holding pending cancel
// groups and enqueues one dispatch scan for each.
type cancelDispatchTickWorker struct {
	river.WorkerDefaults[jobs.CancelDispatchTickArgs]
	d *deps
}

func (w *cancelDispatchTickWorker) Timeout(*river.Job[jobs.CancelDispatchTickArgs]) time.Duration {
	return TickTimeout
}

func (w *cancelDispatchTickWorker) Work(ctx context.Context, _ *river.Job[jobs.CancelDispatchTickArgs]) error {
	return w.d.tick(ctx, river.ClientFromContext[pgx.Tx](ctx), CancelDispatch)
}

var cancelDispatchScan = &scanSpec[store.PendingCancelGroup]{
	name: CancelDispatch,
	scan: store.ScanPendingCancelGroups,
	key:  groupKey,
	rowJob: func(p int16, g store.PendingCancelGroup) river.JobArgs {
		return jobs.CancelDispatchArgs{Partition: p, FlowID: g.FlowID, DownstreamEID: g.DownstreamEID}
	},
	cursor: groupCursor,
	next: func(p int16, after *jobs.ScanCursor, follows int64) river.JobArgs {
		return jobs.CancelDispatchScanArgs{Partition: p, After: after, Follows: follows}
	},
}

// cancelDispatchScanWorker enqueues one dispatch job per pending cancel
// group of a partition.
type cancelDispatchScanWorker struct {
	river.WorkerDefaults[jobs.CancelDispatchScanArgs]
	d *deps
}

func (w *cancelDispatchScanWorker) Timeout(*river.Job[jobs.CancelDispatchScanArgs]) time.Duration {
	return ScanTimeout
}

func (w *cancelDispatchScanWorker) Work(ctx context.Context, job *river.Job[jobs.CancelDispatchScanArgs]) error {
	return runScan(ctx, w.d, cancelDispatchScan, job, job.Args.Partition, job.Args.After, job.Args.Follows)
}

// cancelDispatchWorker drains one pending cancel group.
//
// A group another transaction holds is left for later and the job completes:
// its pending row stays, and since row jobs are unique only among unfinished
// jobs, the next tick's scan enqueues a new job for it. Failing the job
// instead would retry it with River's backoff (seconds, then minutes) rather
// than at the next one-second tick, and count an error for ordinary
// contention.
type cancelDispatchWorker struct {
	river.WorkerDefaults[jobs.CancelDispatchArgs]
	d *deps
}

func (w *cancelDispatchWorker) Timeout(*river.Job[jobs.CancelDispatchArgs]) time.Duration {
	return RowTimeout
}

func (w *cancelDispatchWorker) Work(ctx context.Context, job *river.Job[jobs.CancelDispatchArgs]) error {
	a := job.Args
	c := w.d.cfg.Stats.For(CancelDispatch)
	res, err := store.DispatchCancelGroup(ctx, w.d.cfg.Pool, a.Partition, a.FlowID, a.DownstreamEID, store.NowMs())
	if err != nil {
		c.Errors.Add(1)
		return err
	}
	log := w.d.log().With("reconciler", CancelDispatch, "partition", a.Partition, "flow_id", a.FlowID,
		"downstream_eid", a.DownstreamEID, "job_id", job.ID, "outcome", res.Outcome.String())
	jobLog(ctx).Info("sibling-cancel dispatch", "partition", a.Partition, "flow_id", a.FlowID,
		"downstream_eid", a.DownstreamEID, "outcome", res.Outcome.String(), "siblings_cancelled", res.Cancelled)
	if len(res.BadMembers) > 0 {
		c.Skipped.Add(int64(len(res.BadMembers)))
		log.Warn("edge group lists members that are not UUIDs; skipped them", "bad_members", res.BadMembers)
	}
	if res.RawFieldsMalformed > 0 {
		log.Warn("cancelled siblings whose raw_fields is not a JSON object; last_mutation_at not set, raw_fields left unchanged",
			"siblings", res.RawFieldsMalformed)
	}
	if !res.Changed() {
		c.NoOps.Add(1)
		switch res.Outcome {
		case store.LeftLocked:
			log.Debug("edge group locked by another transaction; left for the next tick")
		case store.LeftForReconciler:
			log.Debug("edge group flag clear; left for the reconciler")
		default:
			log.Debug("pending row already gone; nothing to do")
		}
		return nil
	}
	c.Applied.Add(1)
	if res.Outcome == store.Orphaned {
		log.Warn("pending cancel group without an edge group; deleted the pending row")
		return nil
	}
	log.Debug("sibling cancel dispatched", "members", res.Members, "cancelled", res.Cancelled)
	return nil
}

// ---- reconcile ----

// cancelReconcileTickWorker finds the partitions holding pending cancel
// groups and enqueues one reconcile scan for each.
type cancelReconcileTickWorker struct {
	river.WorkerDefaults[jobs.CancelReconcileTickArgs]
	d *deps
}

func (w *cancelReconcileTickWorker) Timeout(*river.Job[jobs.CancelReconcileTickArgs]) time.Duration {
	return TickTimeout
}

func (w *cancelReconcileTickWorker) Work(ctx context.Context, _ *river.Job[jobs.CancelReconcileTickArgs]) error {
	return w.d.tick(ctx, river.ClientFromContext[pgx.Tx](ctx), CancelReconcile)
}

var cancelReconcileScan = &scanSpec[store.PendingCancelGroup]{
	name: CancelReconcile,
	scan: store.ScanPendingCancelGroups,
	key:  groupKey,
	rowJob: func(p int16, g store.PendingCancelGroup) river.JobArgs {
		return jobs.CancelReconcileArgs{Partition: p, FlowID: g.FlowID, DownstreamEID: g.DownstreamEID}
	},
	cursor: groupCursor,
	next: func(p int16, after *jobs.ScanCursor, follows int64) river.JobArgs {
		return jobs.CancelReconcileScanArgs{Partition: p, After: after, Follows: follows}
	},
}

// cancelReconcileScanWorker enqueues one reconcile job per pending cancel
// group of a partition.
type cancelReconcileScanWorker struct {
	river.WorkerDefaults[jobs.CancelReconcileScanArgs]
	d *deps
}

func (w *cancelReconcileScanWorker) Timeout(*river.Job[jobs.CancelReconcileScanArgs]) time.Duration {
	return ScanTimeout
}

func (w *cancelReconcileScanWorker) Work(ctx context.Context, job *river.Job[jobs.CancelReconcileScanArgs]) error {
	return runScan(ctx, w.d, cancelReconcileScan, job, job.Args.Partition, job.Args.After, job.Args.Follows)
}

// cancelReconcileWorker settles one pending cancel group the dispatcher
// leaves: stale rows are deleted, a flag whose members are all settled is
// cleared.
type cancelReconcileWorker struct {
	river.WorkerDefaults[jobs.CancelReconcileArgs]
	d *deps
}

func (w *cancelReconcileWorker) Timeout(*river.Job[jobs.CancelReconcileArgs]) time.Duration {
	return RowTimeout
}

func (w *cancelReconcileWorker) Work(ctx context.Context, job *river.Job[jobs.CancelReconcileArgs]) error {
	a := job.Args
	c := w.d.cfg.Stats.For(CancelReconcile)
	res, err := store.ReconcileCancelGroup(ctx, w.d.cfg.Pool, a.Partition, a.FlowID, a.DownstreamEID)
	if err != nil {
		c.Errors.Add(1)
		return err
	}
	log := w.d.log().With("reconciler", CancelReconcile, "partition", a.Partition, "flow_id", a.FlowID,
		"downstream_eid", a.DownstreamEID, "job_id", job.ID, "outcome", res.Outcome.String())
	jobLog(ctx).Info("pending cancel group reconciled", "partition", a.Partition, "flow_id", a.FlowID,
		"downstream_eid", a.DownstreamEID, "outcome", res.Outcome.String())
	if len(res.BadMembers) > 0 && res.Changed() {
		// Warned once, when the group is settled, not at every pass that
		// leaves it to the dispatcher (which warns on its own).
		c.Skipped.Add(int64(len(res.BadMembers)))
		log.Warn("edge group lists members that are not UUIDs; ignored them", "bad_members", res.BadMembers)
	}
	if !res.Changed() {
		c.NoOps.Add(1)
		log.Debug("pending cancel group left as is", "live_members", res.Live)
		return nil
	}
	c.Applied.Add(1)
	if res.GroupMissing {
		// Whichever of the dispatcher and the reconciler reaches an orphan
		// first deletes it; both say so the same way.
		log.Warn("pending cancel group without an edge group; deleted the pending row")
		return nil
	}
	log.Debug("pending cancel group reconciled")
	return nil
}
