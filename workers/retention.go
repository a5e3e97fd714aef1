package workers

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
)

// trimBudget is how long one trim job deletes batches before it hands the
// rest of its partition to a continuation at the back of the retention
// queue, so that one partition's backlog does not hold the queue's worker
// while other partitions wait.
const trimBudget = 5 * time.Second

// RetentionAge is how long after it ended an execution is deleted
// (--retention): off unless set, and retention runs only with it.
var RetentionAge = &Setting{
	Flag:     "retention",
	Help:     "delete ended executions (terminal or cancelled) with all their rows once they ended this long ago, e.g. 24h",
	Default:  Off,
	CanBeOff: true,
	Min:      time.Second,
	ShapeKey: "retention",
}

// Retention deletes ended executions, terminal or cancelled (FlowFabric's
// Postgres cancels write lifecycle_phase 'cancelled', which FlowFabric's own
// trim never deletes), whose terminal_at_ms is older than RetentionAge, with
// every sibling row, as FlowFabric's trim does (its text-keyed siblings
// matched under the bare uuid or the wire id {fp:N}:<uuid>). It runs
// only with RetentionAge on. Its partition job does the deleting itself, a
// batch per statement, instead of one row job per execution: a trim is
// set-based by nature, and a River job per execution would cost more than
// the deletes (docs/design.md, "Retention").
var Retention = defineSteps[jobs.RetentionTickArgs, jobs.RetentionTrimArgs](Reconciler{
	Name:     "retention",
	Interval: time.Minute,
	Due:      store.TerminalExecutions,
	Settings: []*Setting{RetentionAge},
	OnlyWith: RetentionAge,
	Behind:   func(v Values) time.Duration { return v.Get(RetentionAge) },
	Tables: append(append([]string{"ff_exec_core", store.TerminalExecutions.Index}, store.RetentionSiblingTables.UUID...),
		store.RetentionSiblingTables.Text...),
}, func(r *Reconciler, d *deps) river.Worker[jobs.RetentionTrimArgs] { return &trimWorker{r: r, d: d} })

// trimWorker trims one partition: batches of Config.BatchSize executions,
// each in its own transaction, until a batch comes back short or trimBudget
// is spent; then, with executions left, it completes itself and enqueues
// its continuation in one transaction (as a scan does).
type trimWorker struct {
	river.WorkerDefaults[jobs.RetentionTrimArgs]
	r *Reconciler
	d *deps
}

// Timeout implements river.Worker.
func (w *trimWorker) Timeout(*river.Job[jobs.RetentionTrimArgs]) time.Duration { return ScanTimeout }

// Work implements river.Worker.
func (w *trimWorker) Work(ctx context.Context, job *river.Job[jobs.RetentionTrimArgs]) error {
	d, r, p := w.d, w.r, job.Args.Partition
	c := d.stats(r)
	if !d.cfg.Settings.On(RetentionAge) {
		// A trim enqueued by a fleet with retention, worked by one without:
		// this process has no retention to apply.
		d.log().Warn("retention trim skipped: this process runs without --retention", "partition", p, "job_id", job.ID)
		return nil
	}
	c.Scans.Add(1)
	start := time.Now()
	var total store.TrimResult
	full := false
	for {
		batchStart := time.Now()
		cutoff := store.NowMs() - d.cfg.Settings.Get(RetentionAge).Milliseconds()
		res, err := store.TrimExecutions(ctx, d.cfg.Pool, p, cutoff, d.cfg.BatchSize, d.cfg.Filter)
		if err != nil {
			c.Errors.Add(1)
			return fmt.Errorf("retention: %w", err)
		}
		c.Examined.Add(int64(res.Executions))
		c.Applied.Add(int64(res.Executions))
		if res.Executions > 0 {
			d.cfg.Observer.Lateness(r.Name, time.Duration(cutoff-res.OldestTerminalMs)*time.Millisecond)
		}
		total.Executions += res.Executions
		total.SiblingRows += res.SiblingRows
		full = res.Executions >= d.cfg.BatchSize
		if !full || time.Since(start) >= trimBudget {
			break
		}
		// Yield as long as the batch took: a backlog is trimmed at half
		// the speed one backend could, and the other reconcilers keep the
		// CPU their lateness needs (docs/benchmarks.md, "Retention").
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Since(batchStart)):
		}
	}
	if full {
		if err := w.continueLater(ctx, job); err != nil {
			c.Errors.Add(1)
			return err
		}
		c.Continuations.Add(1)
	}
	if total.Executions > 0 {
		d.log().Info("trimmed ended executions", "partition", p, "executions", total.Executions,
			"sibling_rows", total.SiblingRows, "continued", full, "elapsed", time.Since(start).Round(time.Millisecond))
	}
	return nil
}

// continueLater completes job and enqueues the partition's next trim in one
// transaction (continueInTx).
func (w *trimWorker) continueLater(ctx context.Context, job *river.Job[jobs.RetentionTrimArgs]) error {
	p := job.Args.Partition
	tx, err := w.d.cfg.Pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("retention trim of partition %d: begin: %w", p, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	next := jobs.RetentionTrimArgs{ScanArgs: jobs.ScanArgs{Partition: p, Follows: job.Args.Follows}}
	if err := continueInTx(ctx, tx, river.ClientFromContext[pgx.Tx](ctx), job, next); err != nil {
		return fmt.Errorf("retention trim of partition %d: %w", p, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("retention trim of partition %d: commit: %w", p, err)
	}
	return nil
}
