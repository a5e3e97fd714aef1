package workers

import (
	"context"
	"time"

	"github.com/riverqueue/river"

	"github.com/flowfabric/ffreconcile/internal/coalesce"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
)

// QuotaReconcile deletes expired quota admissions and their policies' window
// rows older than the window, and sets each capped policy's
// active_concurrency to its live admissions under the policy lock
// check_admission takes: FlowFabric's quota_reconciler, every 30 s, over
// the quota partitions (Config.BudgetPartitionCount, FlowFabric's 32 as
// its budget partitions). On Postgres the counter otherwise only goes up.
// Quota rows belong to no tenant: the tenant filter does not apply, as in
// FlowFabric.
var QuotaReconcile = define[jobs.QuotaReconcileTickArgs, jobs.QuotaReconcileScanArgs](Reconciler{
	Name:       "quota_reconcile",
	Interval:   30 * time.Second,
	Due:        store.ExpiredQuotaAdmissions,
	AllTenants: true,
	Lookahead:  true,
	Partitions: func(c Config) int { return c.BudgetPartitionCount },
	Tables:     []string{"ff_quota_admitted", "ff_quota_policy", "ff_quota_window"},
}, func(p int16, x store.DueRow) jobs.QuotaReconcileArgs {
	return jobs.QuotaReconcileArgs{Partition: p, QuotaPolicyID: x.ID, ExecutionID: x.ID2}
}, func(d *deps) river.Worker[jobs.QuotaReconcileArgs] {
	return &quotaReconcileWorker{d: d, reconciles: batcher(d, func(ctx context.Context, p int16, rows []store.QuotaAdmission) ([]store.QuotaReconcileResult, error) {
		return store.ReconcileQuotas(ctx, d.cfg.Pool, p, rows, store.NowMs())
	})}
})

// quotaReconcileWorker reconciles one expired admission and its policy.
type quotaReconcileWorker struct {
	rowDefaults[jobs.QuotaReconcileArgs]
	d          *deps
	reconciles *coalesce.Coalescer[int16, store.QuotaAdmission, store.QuotaReconcileResult]
}

func (w *quotaReconcileWorker) Work(ctx context.Context, job *river.Job[jobs.QuotaReconcileArgs]) error {
	a := job.Args
	res, logs, ok, err := act(ctx, w.d, rowAction[store.QuotaAdmission, store.QuotaReconcileResult]{
		r: QuotaReconcile, job: job.JobRow, partition: a.Partition, deadlineMs: jobDeadlineMs(job.JobRow, a.DeadlineMs),
		co: w.reconciles, key: store.QuotaAdmission{PolicyID: a.QuotaPolicyID, ExecutionID: a.ExecutionID},
		changed: store.QuotaReconcileResult.Changed,
		found:   func(r store.QuotaReconcileResult) int64 { return r.DeadlineMs },
		row:     store.DueRow{ID: a.QuotaPolicyID, ID2: a.ExecutionID},
		noop:    "quota admission renewed or gone and its policy's counter right under lock; nothing changed",
		attrs:   []any{"quota_policy_id", a.QuotaPolicyID, "execution_id", a.ExecutionID},
	})
	if !ok {
		return err
	}
	if res.WindowNegative < 0 {
		logs.proc.Warn("quota policy's requests_per_window_seconds is negative; its window rows are left alone",
			"requests_per_window_seconds", res.WindowNegative)
	}
	attrs := []any{"admission_deleted", res.Deleted, "window_rows_deleted", res.WindowRowsDeleted,
		"policy_missing", res.PolicyMissing}
	if res.Recounted {
		attrs = append(attrs, "active_concurrency_before", res.ConcurrencyBefore, "active_concurrency", res.ConcurrencyAfter)
	}
	logs.proc.Debug("quota reconciled", attrs...)
	logs.job.Info("quota reconciled", attrs...)
	return nil
}
