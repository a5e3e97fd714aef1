package workers

import (
	"context"
	"time"

	"github.com/riverqueue/river"

	"github.com/flowfabric/ffreconcile/internal/coalesce"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
)

// SuspensionTimeout applies the timeout behaviour of suspensions whose
// timeout lapsed while their execution is still suspended: the execution
// fails, is cancelled or expires (with a completion event), or gets a
// synthetic timeout signal. An execution resumed meanwhile is left alone.
// FlowFabric's suspension_timeout reconciler, every 2 s.
var SuspensionTimeout = define[jobs.SuspensionTimeoutTickArgs, jobs.SuspensionTimeoutScanArgs](Reconciler{
	Name:        "suspension_timeout",
	Interval:    2 * time.Second,
	Due:         store.TimedOutSuspensions,
	Tables:      []string{"ff_suspension_current", "ff_exec_core", "ff_attempt", "ff_completion_event"},
	Lookahead:   true,
	NoOpReasons: []NoOpReason{NoOpNoLongerDue, NoOpNotSuspended},
}, func(p int16, x store.DueRow) jobs.SuspensionExpireArgs {
	return jobs.SuspensionExpireArgs{Partition: p, ExecutionID: x.ID}
}, func(d *deps) river.Worker[jobs.SuspensionExpireArgs] {
	return &suspensionExpireWorker{d: d, suspensions: batcher(d, func(ctx context.Context, p int16, ids []string) ([]store.SuspensionExpireResult, error) {
		return store.ExpireSuspensions(ctx, d.cfg.Pool, p, ids, store.NowMs(), d.cfg.Filter)
	})}
})

// suspensionExpireWorker applies the timeout behaviour of one suspension.
type suspensionExpireWorker struct {
	rowDefaults[jobs.SuspensionExpireArgs]
	d           *deps
	suspensions *coalesce.Coalescer[int16, string, store.SuspensionExpireResult]
}

func (w *suspensionExpireWorker) Work(ctx context.Context, job *river.Job[jobs.SuspensionExpireArgs]) error {
	a := job.Args
	res, logs, ok, err := act(ctx, w.d, rowAction[string, store.SuspensionExpireResult]{
		r: SuspensionTimeout, job: job.JobRow, partition: a.Partition, deadlineMs: jobDeadlineMs(job.JobRow, a.DeadlineMs),
		co: w.suspensions, key: a.ExecutionID,
		changed: func(r store.SuspensionExpireResult) bool { return r.Applied },
		found:   func(r store.SuspensionExpireResult) int64 { return r.DeadlineMs },
		row:     store.DueRow{ID: a.ExecutionID},
		noop:    "suspension resolved or timeout no longer lapsed under lock; nothing changed",
		attrs:   []any{"execution_id", a.ExecutionID},
		why: func(r store.SuspensionExpireResult) (NoOpReason, string, bool) {
			return NoOpNotSuspended, "execution no longer suspended (" + r.NotSuspended +
				"): left untouched; its suspension's lapsed timeout cleared", r.NotSuspended != ""
		},
	})
	if !ok {
		return err
	}
	logs.job.Info("suspension timed out", "timeout_behavior", res.Behavior, "action", res.Action,
		"execution_missing", res.ExecMissing)
	log := logs.proc.With("timeout_behavior", res.Behavior, "action", res.Action, "completion_event_id", res.EventID)
	if res.UnknownBehavior {
		log.Warn("unknown suspension timeout behaviour; applied as fail")
	}
	if res.Action == store.TimeoutAutoResume {
		switch {
		case res.MemberMapReplaced != "":
			log.Warn("suspension member_map was not a JSON object; replaced by one holding only the timeout signal",
				"replaced_member_map", truncate(res.MemberMapReplaced, 512))
		case res.TimeoutEntryNotArray != "":
			log.Warn("suspension member_map.__timeout__ is not an array; kept as is and the timeout signal dropped (timeout cleared)",
				"timeout_entry_type", res.TimeoutEntryNotArray)
		default:
			log.Debug("suspension timed out; timeout signal delivered", "timeout_signals", res.TimeoutSignals)
		}
		return nil
	}
	switch {
	case res.ExecMissing:
		log.Warn("timed-out suspension of an execution whose row is missing: suspension deleted, no completion event written")
	case res.RawFieldsMalformed:
		log.Warn("suspension timed out; execution raw_fields is not a JSON object, left unchanged",
			"outcome", res.Outcome, "event_id", res.EventID)
	default:
		log.Debug("suspension timed out; execution terminal", "outcome", res.Outcome, "event_id", res.EventID)
	}
	return nil
}
