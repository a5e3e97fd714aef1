package workers

import (
	"context"
	"time"

	"github.com/riverqueue/river"

	"github.com/flowfabric/ffreconcile/internal/coalesce"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
)

// BudgetReset zeroes the usage of budgets whose reset time has come and
// schedules their next reset: FlowFabric's budget_reset reconciler, every
// 15 s, over the budget partitions (Config.BudgetPartitionCount). Budgets
// belong to no tenant: the tenant filter does not apply, as in FlowFabric.
var BudgetReset = define[jobs.BudgetResetTickArgs, jobs.BudgetResetScanArgs](Reconciler{
	Name:       "budget_reset",
	Interval:   15 * time.Second,
	Due:        store.DueBudgetResets,
	AllTenants: true,
	Lookahead:  true,
	Partitions: func(c Config) int { return c.BudgetPartitionCount },
	Tables:     []string{"ff_budget_policy", "ff_budget_usage"},
}, func(p int16, x store.DueRow) jobs.BudgetResetArgs {
	return jobs.BudgetResetArgs{Partition: p, BudgetID: x.ID}
}, func(d *deps) river.Worker[jobs.BudgetResetArgs] {
	return &budgetResetWorker{d: d, resets: serialBatcher(d, func(ctx context.Context, p int16, ids []string) ([]store.BudgetResetResult, error) {
		return store.ResetBudgets(ctx, d.cfg.Pool, p, ids, store.NowMs())
	})}
})

// budgetResetWorker resets one budget.
type budgetResetWorker struct {
	rowDefaults[jobs.BudgetResetArgs]
	d      *deps
	resets *coalesce.Coalescer[int16, string, store.BudgetResetResult]
}

func (w *budgetResetWorker) Work(ctx context.Context, job *river.Job[jobs.BudgetResetArgs]) error {
	a := job.Args
	// An error includes a serialization failure that persisted through
	// store's retries (a usage report or an admin reset of the same budget
	// at once): River retries the job.
	res, logs, ok, err := act(ctx, w.d, rowAction[string, store.BudgetResetResult]{
		r: BudgetReset, job: job.JobRow, partition: a.Partition, deadlineMs: jobDeadlineMs(job.JobRow, a.DeadlineMs),
		co: w.resets, key: a.BudgetID,
		changed: func(r store.BudgetResetResult) bool { return r.Applied },
		found:   func(r store.BudgetResetResult) int64 { return r.DeadlineMs },
		row:     store.DueRow{ID: a.BudgetID},
		noop:    "budget reset no longer due under lock; nothing changed",
		attrs:   []any{"budget_id", a.BudgetID},
	})
	if !ok {
		return err
	}
	if res.IntervalMalformed != "" {
		logs.proc.Warn("budget policy's reset_interval_ms is not a whole number; read as 0 (reset once, no next reset), as FlowFabric does",
			"reset_interval_ms", truncate(res.IntervalMalformed, 128))
	}
	logs.proc.Debug("budget reset", "usage_rows", res.UsageRows, "next_reset_at_ms", res.NextResetAtMs)
	logs.job.Info("budget reset", "usage_rows", res.UsageRows, "next_reset_at_ms", res.NextResetAtMs)
	return nil
}
