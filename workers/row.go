package workers

import (
	"context"
	"log/slog"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverlog"
	"github.com/riverqueue/river/rivertype"

	"github.com/flowfabric/ffreconcile/internal/coalesce"
	"github.com/flowfabric/ffreconcile/jobs"
)

// rowDefaults gives a row worker River's defaults and the row timeout.
type rowDefaults[T river.JobArgs] struct{ river.WorkerDefaults[T] }

// Timeout implements river.Worker.
func (rowDefaults[T]) Timeout(*river.Job[T]) time.Duration { return RowTimeout }

// batcher returns the coalescer a row worker asks for its rows: rows of one
// partition asked for while a statement is in flight share the next one.
func batcher[K comparable, Item, Res any](d *deps, run func(ctx context.Context, partition K, items []Item) ([]Res, error)) *coalesce.Coalescer[K, Item, Res] {
	return coalesce.New(coalesce.Config{MaxBatch: d.cfg.RowBatch, InFlight: d.cfg.RowStatements, Timeout: RowTimeout}, run)
}

// serialBatcher is batcher with one statement in flight at a time, for row
// actions that run SERIALIZABLE: two at once would mostly fail each other
// on predicate locks (rows of one partition share index pages), where one
// at a time they never do. Those actions are rare (budget resets).
func serialBatcher[K comparable, Item, Res any](d *deps, run func(ctx context.Context, partition K, items []Item) ([]Res, error)) *coalesce.Coalescer[K, Item, Res] {
	return coalesce.New(coalesce.Config{MaxBatch: d.cfg.RowBatch, InFlight: 1, Timeout: RowTimeout}, run)
}

// snoozeWakeFloor: River's batch completer stores a snooze within about two
// of its 50 ms ticks; a wake-up sent before that would find the job still
// running and be lost.
const snoozeWakeFloor = 100 * time.Millisecond

// wake asks for River's producers to be woken at t (see Config.Wake).
func (d *deps) wake(t time.Time) {
	if d.cfg.Wake != nil {
		d.cfg.Wake(t)
	}
}

// snooze returns the error that snoozes a row job of r for wait and asks for
// the wake-up that starts it again then. River leaves a snooze of at most
// its scheduler interval available (with a future scheduled_at) for the next
// fetch after it; a longer one waits as scheduled.
func (d *deps) snooze(r *Reconciler, wait time.Duration) error {
	d.stats(r).Snoozes.Add(1)
	if wait <= jobs.RiverSchedulerInterval {
		d.wake(time.Now().Add(max(wait, snoozeWakeFloor)))
	}
	return river.JobSnooze(wait)
}

// beforeDeadline snoozes a row job of r that starts before the deadline it
// was enqueued for (deadlineMs, from its args; 0: none) until just after it.
// A job enqueued ahead is scheduled for its deadline by the database's
// clock, while its action re-checks the row by this process's clock; without
// this a job started a little early by clock skew would find its row not yet
// due, do nothing and leave the row to a later tick. Waits longer than
// River's scheduler interval are not snoozed: such a job was not enqueued
// ahead by this fleet, and its action's re-check decides.
func (d *deps) beforeDeadline(r *Reconciler, deadlineMs int64) error {
	if deadlineMs <= 0 {
		return nil
	}
	wait := time.Until(time.UnixMilli(deadlineMs + 1))
	if wait <= 0 || wait > jobs.RiverSchedulerInterval {
		return nil
	}
	return d.snooze(r, wait)
}

// applied records an applied row action of r and its lateness when the row
// job carried the deadline it was scanned with.
func (d *deps) applied(r *Reconciler, deadlineMs int64) {
	d.stats(r).Applied.Add(1)
	if deadlineMs > 0 {
		d.cfg.Observer.Lateness(r.Name, time.Since(time.UnixMilli(deadlineMs)))
	}
}

// rowLogs are the loggers of a row job that changed its row: proc is the
// process log with the reconciler, the row and the job; job is the job's
// own (River UI) with the row.
type rowLogs struct{ proc, job *slog.Logger }

// act runs the common course of a deadline row job of r: it waits for the
// deadline the row was enqueued for (beforeDeadline), asks co for the
// row's action, counts an error, and counts and logs a no-op (the row was
// not due any more under its lock; noop says why). When the action changed
// the row (changed), it records the row as applied and returns the result,
// the job's loggers and true. row names the row in logs, as attribute
// pairs after its partition.
func act[K comparable, R any](ctx context.Context, d *deps, r *Reconciler, job *rivertype.JobRow, partition int16, deadlineMs int64,
	co *coalesce.Coalescer[int16, K, R], key K, changed func(R) bool, noop string, row ...any) (R, rowLogs, bool, error) {
	var res R
	if err := d.beforeDeadline(r, deadlineMs); err != nil {
		return res, rowLogs{}, false, err
	}
	res, err := co.Do(ctx, partition, key)
	if err != nil {
		d.stats(r).Errors.Add(1)
		return res, rowLogs{}, false, err
	}
	row = append([]any{"partition", partition}, row...)
	logs := rowLogs{
		proc: d.log().With(append([]any{"reconciler", r.Name, "job_id", job.ID}, row...)...),
		job:  jobLog(ctx).With(row...),
	}
	if !changed(res) {
		d.stats(r).NoOps.Add(1)
		logs.proc.Debug(noop)
		logs.job.Info(noop)
		return res, logs, false, nil
	}
	d.applied(r, deadlineMs)
	return res, logs, true, nil
}

// jobLog returns the logger whose output River keeps with the job (shown in
// River UI) when the riverlog middleware is installed, else one that
// discards: the process log already has the debug line.
func jobLog(ctx context.Context) *slog.Logger {
	if l, ok := riverlog.LoggerSafely(ctx); ok {
		return l
	}
	return discardLogger
}

var discardLogger = slog.New(slog.DiscardHandler)

// truncate shortens s to at most n bytes for a log line.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
