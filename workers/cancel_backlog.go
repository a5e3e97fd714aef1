package workers

import (
	"context"
	"time"

	"github.com/riverqueue/river"

	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
)

// CancelBacklogGrace is how long after its request a flow's cancel backlog
// header is left to FlowFabric's server before the fleet drains it
// (--cancel-backlog-grace): FlowFabric's CANCEL_RECONCILER_GRACE_MS. A
// header's own grace_until_ms, when set, is its deadline instead.
var CancelBacklogGrace = &Setting{
	Flag:     "cancel-backlog-grace",
	Help:     "cancel_backlog drains a flow's cancel backlog once its grace_until_ms, or its request plus this, has passed",
	Default:  30 * time.Second,
	Min:      time.Millisecond,
	ShapeKey: "cancel_backlog_grace",
}

// cancelBacklogDepthCap caps the depth gauge's count: a huge backlog costs
// a bounded read.
const cancelBacklogDepthCap = 100_000

// CancelBacklog drains ff_cancel_backlog: FlowFabric's cancel_reconciler,
// every 15 s, which its changelog and Postgres parity matrix say exists on
// Postgres and does not. Each header past its grace (at most
// store.CancelBacklogBatch a partition per tick, ScanLimit) gets a row job
// that, in one transaction, cancels its live members as FlowFabric's
// operator cancel does and acks up to store.CancelBacklogMembers of them as
// ack_cancel_member does (store.DrainCancelBacklog); a flow missing from
// ff_flow_core has its backlog rows deleted. The tenant filter applies per
// member. Its gauge is FlowFabric's ff_cancel_backlog_depth, never set on
// Postgres.
var CancelBacklog = define[jobs.CancelBacklogTickArgs, jobs.CancelBacklogScanArgs](Reconciler{
	Name:      "cancel_backlog",
	Interval:  15 * time.Second,
	Due:       store.CancelBacklogHeaders,
	ScanLimit: store.CancelBacklogBatch,
	Settings:  []*Setting{CancelBacklogGrace},
	Behind:    func(v Values) time.Duration { return v.Get(CancelBacklogGrace) },
	Tables: []string{"ff_cancel_backlog", "ff_cancel_backlog_member", "ff_flow_core", "ff_exec_core", "ff_attempt",
		"ff_lease_event", store.CancelBacklogHeaders.Index},
	NoOpReasons: []NoOpReason{NoOpGone, NoOpNotDueYet},
	Gauges: []Gauge{{
		Name: "cancel_backlog_depth",
		Help: "Flows in the cancel backlog (ff_cancel_backlog headers) with a member of this fleet's tenant, counted up to a cap: FlowFabric's ff_cancel_backlog_depth.",
		Read: func(ctx context.Context, db store.DB, f store.Filter) (float64, error) {
			n, err := store.CancelBacklogDepth(ctx, db, f, cancelBacklogDepthCap)
			return float64(n), err
		},
	}},
}, func(p int16, x store.DueRow) jobs.CancelBacklogDrainArgs {
	return jobs.CancelBacklogDrainArgs{Partition: p, FlowID: x.ID}
}, func(d *deps) river.Worker[jobs.CancelBacklogDrainArgs] { return &cancelBacklogWorker{d: d} })

// cancelBacklogWorker drains one flow's cancel backlog header.
type cancelBacklogWorker struct {
	rowDefaults[jobs.CancelBacklogDrainArgs]
	d *deps
}

func (w *cancelBacklogWorker) Work(ctx context.Context, job *river.Job[jobs.CancelBacklogDrainArgs]) error {
	a := job.Args
	c := w.d.stats(CancelBacklog)
	now := store.NowMs()
	res, err := store.DrainCancelBacklog(ctx, w.d.cfg.Pool, a.Partition, a.FlowID,
		w.d.cfg.Settings.Get(CancelBacklogGrace).Milliseconds(), now, w.d.cfg.Filter)
	if err != nil {
		c.Errors.Add(1)
		return err
	}
	log := w.d.log().With("reconciler", CancelBacklog.Name, "partition", a.Partition, "flow_id", a.FlowID,
		"job_id", job.ID, "outcome", res.Outcome.String())
	if res.Outcome == store.BacklogOutsideTenant {
		return w.d.outsideTenant(CancelBacklog, a.Partition, log)
	}
	jobLog(ctx).Info("cancel backlog drained", "outcome", res.Outcome.String(), "members", res.Members,
		"cancelled", res.Cancelled, "acked", res.Acked, "header_deleted", res.HeaderDeleted)
	if len(res.BadMembers) > 0 {
		// Never stops the header's other members: they were drained in
		// the same pass.
		c.Skipped.Add(int64(len(res.BadMembers)))
		log.Warn("cancel backlog members that are not wire ids {fp:N}:<uuid> of the flow's partition; deleted them",
			"bad_members", res.BadMembers)
	}
	if res.RawFieldsMalformed > 0 {
		log.Warn("cancelled members whose raw_fields is not a JSON object; last_mutation_at not set, raw_fields left unchanged",
			"members", res.RawFieldsMalformed)
	}
	if !res.Changed() {
		why := NoOpGone
		if res.Outcome == store.BacklogNotDue {
			why = NoOpNotDueYet
		}
		c.NoOp(why)
		log.Debug("cancel backlog header left as is", "left_outside_tenant", res.LeftOutsideTenant)
		return nil
	}
	c.Applied.Add(1)
	if res.DeadlineMs > 0 {
		w.d.cfg.Observer.Lateness(CancelBacklog.Name, time.Duration(now-res.DeadlineMs)*time.Millisecond)
	}
	if res.Outcome == store.BacklogFlowMissing {
		log.Warn("cancel backlog of a flow missing from ff_flow_core; deleted its header and members", "members", res.Acked)
		return nil
	}
	log.Debug("cancel backlog drained", "members", res.Members, "cancelled", res.Cancelled, "leases_revoked", res.LeasesRevoked,
		"acked", res.Acked, "left_outside_tenant", res.LeftOutsideTenant, "header_deleted", res.HeaderDeleted)
	return nil
}
