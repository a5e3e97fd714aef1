package workers

import (
	"context"
	"time"

	"github.com/riverqueue/river"

	"github.com/flowfabric/ffreconcile/internal/coalesce"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
)

// ClaimGrantExpiry deletes expired claim grants of either kind and makes an
// execution FlowFabric's Postgres scheduler left in pending_claim with no
// live grant eligible again, every 5 s: the "future reaper" of FlowFabric's
// migration 0017, which its Postgres backend never runs (on Valkey a grant
// is a key with a TTL, and the execution stays eligible_now). Each reset
// is re-checked under the execution's lock, so a claim consuming its grant
// at that moment wins.
var ClaimGrantExpiry = define[jobs.ClaimGrantExpiryTickArgs, jobs.ClaimGrantExpiryScanArgs](Reconciler{
	Name:      "claim_grant_expiry",
	Interval:  5 * time.Second,
	Due:       store.ExpiredClaimGrants,
	Lookahead: true,
	Tables:    []string{"ff_claim_grant", "ff_exec_core"},
}, func(p int16, x store.DueRow) jobs.ClaimGrantExpireArgs {
	return jobs.ClaimGrantExpireArgs{Partition: p, GrantID: x.ID}
}, func(d *deps) river.Worker[jobs.ClaimGrantExpireArgs] {
	return &claimGrantExpireWorker{d: d, expires: batcher(d, func(ctx context.Context, p int16, ids []string) ([]store.ClaimGrantExpiryResult, error) {
		return store.ExpireClaimGrants(ctx, d.cfg.Pool, p, ids, store.NowMs(), d.cfg.Filter)
	})}
})

// claimGrantExpireWorker expires one claim grant.
type claimGrantExpireWorker struct {
	rowDefaults[jobs.ClaimGrantExpireArgs]
	d       *deps
	expires *coalesce.Coalescer[int16, string, store.ClaimGrantExpiryResult]
}

func (w *claimGrantExpireWorker) Work(ctx context.Context, job *river.Job[jobs.ClaimGrantExpireArgs]) error {
	a := job.Args
	res, logs, ok, err := act(ctx, w.d, rowAction[string, store.ClaimGrantExpiryResult]{
		r: ClaimGrantExpiry, job: job.JobRow, partition: a.Partition, deadlineMs: jobDeadlineMs(job.JobRow, a.DeadlineMs),
		co: w.expires, key: a.GrantID,
		changed: func(r store.ClaimGrantExpiryResult) bool { return r.Deleted },
		found:   func(r store.ClaimGrantExpiryResult) int64 { return r.DeadlineMs },
		row:     store.DueRow{ID: a.GrantID},
		noop:    "claim grant consumed, gone or no longer expired under lock; nothing changed",
		attrs:   []any{"grant_id", a.GrantID},
	})
	if !ok {
		return err
	}
	log := logs.proc.With("execution_id", res.ExecutionID, "kind", res.Kind)
	if res.ExecMissing {
		log.Warn("deleted an expired claim grant whose execution row is missing")
	} else {
		log.Debug("deleted expired claim grant", "reset", res.Reset)
	}
	logs.job.Info("deleted expired claim grant", "execution_id", res.ExecutionID, "kind", res.Kind,
		"execution_eligible_again", res.Reset)
	return nil
}
