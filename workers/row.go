package workers

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverlog"
	"github.com/riverqueue/river/rivertype"

	"github.com/flowfabric/ffreconcile/internal/coalesce"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
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
	wait := time.UnixMilli(deadlineMs + 1).Sub(d.rowNow())
	if wait <= 0 || wait > jobs.RiverSchedulerInterval {
		return nil
	}
	return d.snooze(r, wait)
}

// jobDeadlineMs returns the deadline (Unix ms; 0: none) a row job of a
// reconciler with deadlines was enqueued for: argsMs, its args'
// deadline_ms, when set (jobs of earlier versions, or inserted by others;
// the scans leave it out, see runScan), else, for a job given a schedule of
// its own (a row enqueued ahead), that schedule less the millisecond the
// scan adds. A job River scheduled itself (created and scheduled at the same
// instant: a row already due) has none, and neither has one on a retry,
// whose schedule is its backoff's. A snooze before the deadline moves the schedule to just after
// it, which keeps the deadline read from it.
func jobDeadlineMs(job *rivertype.JobRow, argsMs int64) int64 {
	if argsMs > 0 {
		return argsMs
	}
	if len(job.Errors) > 0 || job.ScheduledAt.Equal(job.CreatedAt) {
		return 0
	}
	return job.ScheduledAt.UnixMilli() - 1
}

// applied records an applied row action of r and its lateness from
// deadlineMs (0: none; see act).
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

// rowAction is one deadline row job's action, run by act.
type rowAction[K comparable, R any] struct {
	r          *Reconciler
	job        *rivertype.JobRow
	partition  int16
	deadlineMs int64 // the deadline the row was enqueued for (0: none; see jobDeadlineMs)
	// co runs the action for key, batched with other rows of the
	// partition; changed says whether it changed the row.
	co      *coalesce.Coalescer[int16, K, R]
	key     K
	changed func(R) bool
	// found returns the deadline the action found its row with under lock
	// (0: none), which the lateness metric measures from: a row already due
	// when scanned is enqueued without it, and a row found ahead may have
	// moved on since its job was scheduled.
	found func(R) int64
	// row is the row as its Due's scans return it, for the tenant check of
	// a no-op.
	row store.DueRow
	// noop says, for the logs, why an action changes nothing; attrs name
	// the row in logs, after its partition.
	noop  string
	attrs []any
	// why, when set, tells a no-op's reason and log line from its result
	// (ok false: the defaults, NoOpNoLongerDue and noop).
	why func(R) (reason NoOpReason, msg string, ok bool)
}

// act runs the common course of a deadline row job: it waits for the
// deadline the row was enqueued for (beforeDeadline), asks a.co for the
// row's action, counts an error, and counts and logs a no-op (the row was
// not due any more under its lock) or cancels the job of a row outside the
// fleet's tenant filter. When the action changed the row, it records the
// row as applied and returns the result, the job's loggers and true.
func act[K comparable, R any](ctx context.Context, d *deps, a rowAction[K, R]) (R, rowLogs, bool, error) {
	var res R
	if err := d.beforeDeadline(a.r, a.deadlineMs); err != nil {
		return res, rowLogs{}, false, err
	}
	res, err := a.co.Do(ctx, a.partition, a.key)
	if err != nil {
		d.stats(a.r).Errors.Add(1)
		return res, rowLogs{}, false, err
	}
	attrs := append([]any{"partition", a.partition}, a.attrs...)
	logs := rowLogs{
		proc: d.log().With(append([]any{"reconciler", a.r.Name, "job_id", a.job.ID}, attrs...)...),
		// The row's ids are the job's args, beside its log in River UI
		// (see the fleet's job log).
		job: jobLog(ctx),
	}
	if !a.changed(res) {
		if err := d.checkTenant(ctx, a.r, a.partition, a.row, logs.proc); err != nil {
			return res, logs, false, err
		}
		reason, msg := NoOpNoLongerDue, a.noop
		if a.why != nil {
			if r, m, ok := a.why(res); ok {
				reason, msg = r, m
			}
		}
		d.stats(a.r).NoOp(reason)
		logs.proc.Debug(msg)
		logs.job.Info(msg)
		return res, logs, false, nil
	}
	// The deadline found under lock; the job's for an action that found
	// none (a worker registration's sum out of range, say).
	late := a.found(res)
	if late <= 0 {
		late = a.deadlineMs
	}
	d.applied(a.r, late)
	return res, logs, true, nil
}

// checkTenant returns the error that cancels the job of a row of r that
// changed nothing because it lies outside the fleet's tenant filter (its
// row statement re-checks the filter): such a job was enqueued by someone
// else (another fleet's River schema shares no jobs with this one), and
// retrying it here would never change the row. Nil when the fleet has no
// filter or the row is in it.
func (d *deps) checkTenant(ctx context.Context, r *Reconciler, partition int16, row store.DueRow, log *slog.Logger) error {
	if d.cfg.Filter.Empty() {
		return nil
	}
	outside, err := r.Due.Outside(ctx, d.cfg.Pool, partition, row, d.cfg.Filter)
	if err != nil || !outside {
		return err
	}
	return d.outsideTenant(r, partition, log)
}

// outsideTenant counts and logs the job of a row of r outside the fleet's
// tenant filter and returns the error that cancels it (see checkTenant).
func (d *deps) outsideTenant(r *Reconciler, partition int16, log *slog.Logger) error {
	d.stats(r).Skipped.Add(1)
	log.Warn("row outside this fleet's tenant filter; job cancelled, row left unchanged",
		"namespace", d.cfg.Filter.Namespace, "tag_key", d.cfg.Filter.TagKey, "tag_value", d.cfg.Filter.TagValue)
	return river.JobCancel(fmt.Errorf("%s row in partition %d is outside this fleet's tenant filter (%s); left unchanged",
		r.Name, partition, d.cfg.Filter))
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
