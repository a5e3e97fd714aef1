package workers

import (
	"context"
	"time"

	"github.com/riverqueue/river"

	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
)

// CancelReconcile clears the pending cancel rows the dispatcher leaves:
// stale rows (group missing or flag clear) are deleted, and a flag whose
// members are all settled is cleared. FlowFabric's edge_cancel_reconciler,
// every 10 s.
var CancelReconcile = define[jobs.CancelReconcileTickArgs, jobs.CancelReconcileScanArgs](Reconciler{
	Name:        "cancel_reconcile",
	Interval:    10 * time.Second,
	Due:         store.PendingCancelGroups,
	Tables:      []string{"ff_pending_cancel_groups", "ff_edge_group", "ff_exec_core"},
	NoOpReasons: []NoOpReason{NoOpGone, NoOpMembersLive},
}, func(p int16, x store.DueRow) jobs.CancelReconcileArgs {
	return jobs.CancelReconcileArgs{Partition: p, FlowID: x.ID, DownstreamEID: x.ID2}
}, func(d *deps) river.Worker[jobs.CancelReconcileArgs] { return &cancelReconcileWorker{d: d} })

// cancelReconcileWorker settles one pending cancel group the dispatcher
// leaves: stale rows are deleted, a flag whose members are all settled is
// cleared.
type cancelReconcileWorker struct {
	rowDefaults[jobs.CancelReconcileArgs]
	d *deps
}

func (w *cancelReconcileWorker) Work(ctx context.Context, job *river.Job[jobs.CancelReconcileArgs]) error {
	a := job.Args
	c := w.d.stats(CancelReconcile)
	res, err := store.ReconcileCancelGroup(ctx, w.d.cfg.Pool, a.Partition, a.FlowID, a.DownstreamEID, w.d.cfg.Filter)
	if err != nil {
		c.Errors.Add(1)
		return err
	}
	log := w.d.log().With("reconciler", CancelReconcile.Name, "partition", a.Partition, "flow_id", a.FlowID,
		"downstream_eid", a.DownstreamEID, "job_id", job.ID, "outcome", res.Outcome.String())
	if res.Outcome == store.ReconcileOutsideTenant {
		return w.d.outsideTenant(CancelReconcile, a.Partition, log)
	}
	jobLog(ctx).Info("pending cancel group reconciled", "outcome", res.Outcome.String())
	if len(res.BadMembers) > 0 && res.Changed() {
		// Warned once, when the group is settled, not at every pass that
		// leaves it to the dispatcher (which warns on its own).
		c.Skipped.Add(int64(len(res.BadMembers)))
		log.Warn("edge group lists members that are not UUIDs; ignored them", "bad_members", res.BadMembers)
	}
	if !res.Changed() {
		why := NoOpMembersLive
		if res.Outcome == store.PendingGone {
			why = NoOpGone
		}
		c.NoOp(why)
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
