package workers

import (
	"context"
	"time"

	"github.com/riverqueue/river"

	"github.com/flowfabric/ffreconcile/internal/coalesce"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
)

// BudgetDedupExpiry deletes report_usage idempotency keys
// (ff_budget_usage_dedup) past their expires_at_ms, every 30 s, over the
// budget partitions: the "future TTL sweeper" of FlowFabric's migration
// 0002, which its Postgres backend never runs (Valkey expires the keys by
// their TTL). Dedup keys belong to no tenant: the tenant filter does not
// apply.
var BudgetDedupExpiry = define[jobs.BudgetDedupExpiryTickArgs, jobs.BudgetDedupExpiryScanArgs](Reconciler{
	Name:       "budget_dedup_expiry",
	Interval:   30 * time.Second,
	Due:        store.ExpiredBudgetDedupKeys,
	AllTenants: true,
	Lookahead:  true,
	Partitions: func(c Config) int { return c.BudgetPartitionCount },
	Tables:     []string{"ff_budget_usage_dedup"},
}, func(p int16, x store.DueRow) jobs.BudgetDedupDeleteArgs {
	return jobs.BudgetDedupDeleteArgs{Partition: p, DedupKey: x.ID}
}, func(d *deps) river.Worker[jobs.BudgetDedupDeleteArgs] {
	return &budgetDedupDeleteWorker{d: d, deletes: batcher(d, func(ctx context.Context, p int16, keys []string) ([]store.BudgetDedupExpiryResult, error) {
		return store.DeleteExpiredBudgetDedupKeys(ctx, d.cfg.Pool, p, keys, store.NowMs())
	})}
})

// budgetDedupDeleteWorker deletes one expired dedup key.
type budgetDedupDeleteWorker struct {
	rowDefaults[jobs.BudgetDedupDeleteArgs]
	d       *deps
	deletes *coalesce.Coalescer[int16, string, store.BudgetDedupExpiryResult]
}

func (w *budgetDedupDeleteWorker) Work(ctx context.Context, job *river.Job[jobs.BudgetDedupDeleteArgs]) error {
	a := job.Args
	_, logs, ok, err := act(ctx, w.d, rowAction[string, store.BudgetDedupExpiryResult]{
		r: BudgetDedupExpiry, job: job.JobRow, partition: a.Partition, deadlineMs: jobDeadlineMs(job.JobRow, a.DeadlineMs),
		co: w.deletes, key: a.DedupKey,
		changed: func(r store.BudgetDedupExpiryResult) bool { return r.Deleted },
		found:   func(r store.BudgetDedupExpiryResult) int64 { return r.DeadlineMs },
		row:     store.DueRow{ID: a.DedupKey},
		noop:    "budget dedup key renewed or gone under lock; nothing changed",
		attrs:   []any{"dedup_key", truncate(a.DedupKey, 128)},
	})
	if !ok {
		return err
	}
	logs.proc.Debug("deleted expired budget dedup key")
	logs.job.Info("deleted expired budget dedup key")
	return nil
}
