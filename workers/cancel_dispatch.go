package workers

import (
	"context"
	"time"

	"github.com/riverqueue/river"

	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
)

// CancelDispatch drains pending cancel groups: the siblings a satisfied
// quorum left over are cancelled, oldest group first, each group locked FOR
// UPDATE SKIP LOCKED so concurrent dispatches coalesce. FlowFabric's
// edge_cancel_dispatcher, every 1 s. A group belongs to the tenant of its
// downstream execution (see package store). Its due rows are the pending
// groups whose edge group has its flag set or is missing
// (store.DispatchableCancelGroups): a group whose flag is clear is
// CancelReconcile's to delete, and offered to the dispatcher it would cost a
// row job every tick that changes nothing.
var CancelDispatch = define[jobs.CancelDispatchTickArgs, jobs.CancelDispatchScanArgs](Reconciler{
	Name:        "cancel_dispatch",
	Interval:    time.Second,
	Due:         store.DispatchableCancelGroups,
	Tables:      []string{"ff_pending_cancel_groups", "ff_edge_group", "ff_exec_core"},
	NoOpReasons: []NoOpReason{NoOpGone, NoOpLocked, NoOpFlagClear},
}, func(p int16, x store.DueRow) jobs.CancelDispatchArgs {
	return jobs.CancelDispatchArgs{Partition: p, FlowID: x.ID, DownstreamEID: x.ID2}
}, func(d *deps) river.Worker[jobs.CancelDispatchArgs] { return &cancelDispatchWorker{d: d} })

// cancelDispatchWorker drains one pending cancel group.
//
// A group another transaction holds is left for later and the job completes:
// its pending row stays, and since row jobs are unique only among unfinished
// jobs, the next tick's scan enqueues a new job for it. Failing the job
// instead would retry it with River's backoff (seconds, then minutes) rather
// than at the next one-second tick, and count an error for ordinary
// contention.
type cancelDispatchWorker struct {
	rowDefaults[jobs.CancelDispatchArgs]
	d *deps
}

func (w *cancelDispatchWorker) Work(ctx context.Context, job *river.Job[jobs.CancelDispatchArgs]) error {
	a := job.Args
	c := w.d.stats(CancelDispatch)
	res, err := store.DispatchCancelGroup(ctx, w.d.cfg.Pool, a.Partition, a.FlowID, a.DownstreamEID, store.NowMs(), w.d.cfg.Filter)
	if err != nil {
		c.Errors.Add(1)
		return err
	}
	log := w.d.log().With("reconciler", CancelDispatch.Name, "partition", a.Partition, "flow_id", a.FlowID,
		"downstream_eid", a.DownstreamEID, "job_id", job.ID, "outcome", res.Outcome.String())
	if res.Outcome == store.DispatchOutsideTenant {
		return w.d.outsideTenant(CancelDispatch, a.Partition, log)
	}
	jobLog(ctx).Info("sibling-cancel dispatch", "outcome", res.Outcome.String(), "siblings_cancelled", res.Cancelled)
	if len(res.BadMembers) > 0 {
		c.Skipped.Add(int64(len(res.BadMembers)))
		log.Warn("edge group lists members that are not UUIDs; skipped them", "bad_members", res.BadMembers)
	}
	if res.RawFieldsMalformed > 0 {
		log.Warn("cancelled siblings whose raw_fields is not a JSON object; last_mutation_at not set, raw_fields left unchanged",
			"siblings", res.RawFieldsMalformed)
	}
	if !res.Changed() {
		switch res.Outcome {
		case store.LeftLocked:
			c.NoOp(NoOpLocked)
			log.Debug("edge group locked by another transaction; left for the next tick")
		case store.LeftForReconciler:
			c.NoOp(NoOpFlagClear)
			log.Debug("edge group flag clear; left for the reconciler")
		default:
			c.NoOp(NoOpGone)
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
