package workers

import (
	"context"
	"time"

	"github.com/riverqueue/river"

	"github.com/flowfabric/ffreconcile/internal/coalesce"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
)

// ExecutionDeadline makes active executions past their deadline terminal,
// interrupting their current attempt, with `expired` completion and lease
// events: FlowFabric's expire_for_execution, swept every 5 s (FlowFabric
// schedules it on Valkey only; the scan follows its Valkey scanner).
var ExecutionDeadline = define[jobs.ExecutionDeadlineTickArgs, jobs.ExecutionDeadlineScanArgs](Reconciler{
	Name:      "execution_deadline",
	Interval:  5 * time.Second,
	Due:       store.PastDeadlineExecutions,
	Lookahead: true,
	Tables:    []string{"ff_exec_core", "ff_attempt", "ff_completion_event", "ff_lease_event"},
}, func(p int16, x store.DueRow) jobs.DeadlineExpireArgs {
	return jobs.DeadlineExpireArgs{Partition: p, ExecutionID: x.ID}
}, func(d *deps) river.Worker[jobs.DeadlineExpireArgs] {
	return &deadlineExpireWorker{d: d, expires: batcher(d, func(ctx context.Context, p int16, ids []string) ([]store.DeadlineResult, error) {
		return store.ExpireDeadlines(ctx, d.cfg.Pool, p, ids, store.NowMs(), d.cfg.Filter)
	})}
})

// deadlineExpireWorker expires one execution past its deadline.
type deadlineExpireWorker struct {
	rowDefaults[jobs.DeadlineExpireArgs]
	d       *deps
	expires *coalesce.Coalescer[int16, string, store.DeadlineResult]
}

func (w *deadlineExpireWorker) Work(ctx context.Context, job *river.Job[jobs.DeadlineExpireArgs]) error {
	a := job.Args
	res, logs, ok, err := act(ctx, w.d, rowAction[string, store.DeadlineResult]{
		r: ExecutionDeadline, job: job.JobRow, partition: a.Partition, deadlineMs: jobDeadlineMs(job.JobRow, a.DeadlineMs),
		co: w.expires, key: a.ExecutionID,
		changed: func(r store.DeadlineResult) bool { return r.Applied },
		found:   func(r store.DeadlineResult) int64 { return r.DeadlineMs },
		row:     store.DueRow{ID: a.ExecutionID},
		noop:    "execution no longer active or its deadline moved under lock; nothing changed",
		attrs:   []any{"execution_id", a.ExecutionID},
	})
	if !ok {
		return err
	}
	if res.RawFieldsMalformed {
		logs.proc.Warn("execution expired at its deadline; raw_fields is not a JSON object, left unchanged")
	} else {
		logs.proc.Debug("execution expired at its deadline", "attempt_interrupted", res.AttemptInterrupted,
			"event_id", res.EventID, "completion_event_id", res.CompletionEventID)
	}
	logs.job.Info("execution expired at its deadline", "attempt_interrupted", res.AttemptInterrupted)
	return nil
}
