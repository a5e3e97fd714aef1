package workers

import (
	"context"
	"time"

	"github.com/riverqueue/river"

	"github.com/flowfabric/ffreconcile/internal/coalesce"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
)

// WaitpointExpiry closes pending waitpoints whose expiry passed and records
// a never_committed marker in their suspension's member_map: FlowFabric's
// pending_wp_expiry close_for_execution, swept every 5 s (FlowFabric
// schedules it on Valkey only; the scan follows its Valkey scanner). Waking
// or failing the suspended execution stays suspension_timeout's.
var WaitpointExpiry = define[jobs.WaitpointExpiryTickArgs, jobs.WaitpointExpiryScanArgs](Reconciler{
	Name:      "waitpoint_expiry",
	Interval:  5 * time.Second,
	Due:       store.ExpiredWaitpoints,
	Lookahead: true,
	Tables:    []string{"ff_waitpoint_pending", "ff_suspension_current", "ff_exec_core"},
}, func(p int16, x store.DueRow) jobs.WaitpointCloseArgs {
	return jobs.WaitpointCloseArgs{Partition: p, WaitpointID: x.ID}
}, func(d *deps) river.Worker[jobs.WaitpointCloseArgs] {
	return &waitpointCloseWorker{d: d, closes: batcher(d, func(ctx context.Context, p int16, ids []string) ([]store.WaitpointCloseResult, error) {
		return store.CloseWaitpoints(ctx, d.cfg.Pool, p, ids, store.NowMs(), d.cfg.Filter)
	})}
})

// waitpointCloseWorker closes one expired waitpoint.
type waitpointCloseWorker struct {
	rowDefaults[jobs.WaitpointCloseArgs]
	d      *deps
	closes *coalesce.Coalescer[int16, string, store.WaitpointCloseResult]
}

func (w *waitpointCloseWorker) Work(ctx context.Context, job *river.Job[jobs.WaitpointCloseArgs]) error {
	a := job.Args
	res, logs, ok, err := act(ctx, w.d, rowAction[string, store.WaitpointCloseResult]{
		r: WaitpointExpiry, job: job.JobRow, partition: a.Partition, deadlineMs: jobDeadlineMs(job.JobRow, a.DeadlineMs),
		co: w.closes, key: a.WaitpointID,
		changed: func(r store.WaitpointCloseResult) bool { return r.Closed },
		found:   func(r store.WaitpointCloseResult) int64 { return r.DeadlineMs },
		row:     store.DueRow{ID: a.WaitpointID},
		noop:    "waitpoint gone or no longer expired under lock; nothing changed",
		attrs:   []any{"waitpoint_id", a.WaitpointID},
	})
	if !ok {
		return err
	}
	log := logs.proc.With("execution_id", res.ExecutionID, "key", res.Key)
	switch {
	case res.ExecMissing:
		log.Warn("closed an expired waitpoint whose execution row is missing", "marked", res.Marked)
	case res.MemberMapReplaced != "":
		log.Warn("suspension member_map was not a JSON object; replaced by one holding the never_committed marker, as FlowFabric does",
			"replaced_member_map", truncate(res.MemberMapReplaced, 512))
	default:
		log.Debug("closed expired waitpoint", "marked", res.Marked)
	}
	logs.job.Info("closed expired waitpoint", "execution_id", res.ExecutionID, "member_map_key", res.Key,
		"suspension_marked", res.Marked)
	return nil
}
