package workers

import (
	"context"
	"time"

	"github.com/riverqueue/river"

	"github.com/flowfabric/ffreconcile/internal/coalesce"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
)

// AttemptTimeout interrupts attempts whose lease lapsed while their
// execution is active, and retries the execution (its next attempt index)
// or, its policy's retries exhausted, makes it terminal with an `expired`
// completion event: FlowFabric's attempt_timeout reconciler, every 2 s.
//
// Its rows are LeaseExpiry's too (an expired lease on an active
// execution), for which FlowFabric's two loops race. A fleet running both
// decides instead, row by row, by the execution's retry policy: attempt
// timeout takes the attempts of executions declaring retries
// (store.TimedOutAttemptsShare), lease expiry every other expired lease, so
// each row gets one row job (docs/design.md, "Attempt timeout and lease
// expiry"). Each action still re-checks its own condition under lock, so a
// job of either enqueued by anyone applies that reconciler's whole action or
// nothing.
var AttemptTimeout = define[jobs.AttemptTimeoutTickArgs, jobs.AttemptTimeoutScanArgs](Reconciler{
	Name:      "attempt_timeout",
	Interval:  2 * time.Second,
	Due:       store.TimedOutAttempts,
	Shares:    &Share{With: "lease_expiry", Due: store.TimedOutAttemptsShare},
	Lookahead: true,
	Tables:    []string{"ff_attempt", "ff_exec_core", "ff_completion_event", "ff_lease_event"},
}, func(p int16, x store.DueRow) jobs.AttemptExpireArgs {
	return jobs.AttemptExpireArgs{Partition: p, ExecutionID: x.ID, AttemptIndex: x.N}
}, func(d *deps) river.Worker[jobs.AttemptExpireArgs] {
	return &attemptExpireWorker{d: d, expires: batcher(d, func(ctx context.Context, p int16, refs []store.LeaseRef) ([]store.AttemptTimeoutResult, error) {
		return store.ExpireAttempts(ctx, d.cfg.Pool, p, refs, store.NowMs(), d.cfg.Filter)
	})}
})

// attemptExpireWorker applies the attempt timeout to one attempt.
type attemptExpireWorker struct {
	rowDefaults[jobs.AttemptExpireArgs]
	d       *deps
	expires *coalesce.Coalescer[int16, store.LeaseRef, store.AttemptTimeoutResult]
}

func (w *attemptExpireWorker) Work(ctx context.Context, job *river.Job[jobs.AttemptExpireArgs]) error {
	a := job.Args
	res, logs, ok, err := act(ctx, w.d, rowAction[store.LeaseRef, store.AttemptTimeoutResult]{
		r: AttemptTimeout, job: job.JobRow, partition: a.Partition, deadlineMs: jobDeadlineMs(job.JobRow, a.DeadlineMs),
		co: w.expires, key: store.LeaseRef{ExecutionID: a.ExecutionID, AttemptIndex: a.AttemptIndex},
		changed: func(r store.AttemptTimeoutResult) bool { return r.Applied },
		found:   func(r store.AttemptTimeoutResult) int64 { return r.DeadlineMs },
		row:     store.DueRow{ID: a.ExecutionID, N: a.AttemptIndex},
		noop:    "attempt no longer timed out under lock (lease renewed or released, execution no longer active); nothing changed",
		attrs:   []any{"execution_id", a.ExecutionID, "attempt_index", a.AttemptIndex},
	})
	if !ok {
		return err
	}
	outcome := "execution terminal (retries exhausted)"
	if res.Retried {
		outcome = "execution retried"
	}
	if res.PolicyMalformed != "" {
		logs.proc.Warn("execution policy's retry_policy.max_retries is not a whole number from 0 to 2^32-1; read as 0, as FlowFabric does",
			"max_retries", truncate(res.PolicyMalformed, 128))
	}
	if res.RawFieldsMalformed {
		logs.proc.Warn("attempt timed out; execution raw_fields is not a JSON object, left unchanged", "outcome", outcome)
	} else {
		logs.proc.Debug("attempt timed out", "outcome", outcome, "event_id", res.EventID, "completion_event_id", res.CompletionEventID)
	}
	logs.job.Info("attempt timed out", "outcome", outcome)
	return nil
}
