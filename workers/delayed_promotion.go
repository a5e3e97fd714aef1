package workers

import (
	"context"
	"encoding/json"
	"time"

	"github.com/riverqueue/river"

	"github.com/flowfabric/ffreconcile/internal/coalesce"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
)

// Snoozing of promotions that run before their execution's delay-until. An
// ad-hoc promotion's "at" may be a little early (clock skew between services,
// a delay-until rounded down) or the execution may have been re-delayed since
// the job was queued. Such a job re-schedules itself for the delay-until, so a
// scheduled promotion happens on time even where no sweep runs, instead of
// completing as a no-op and leaving the execution to the next sweep. Both
// bounds keep a job from lingering: a delay-until further away than
// MaxPromoteSnooze, or a job already snoozed MaxPromoteSnoozes times (an
// execution re-delayed again and again), is left to the sweep. River does not
// count snoozes as attempts.
const (
	MaxPromoteSnooze  = time.Hour
	MaxPromoteSnoozes = 10
)

// DelayedPromotion promotes delayed executions (runnable +
// not_eligible_until_time) whose delay-until passed to eligible_now, as
// FlowFabric's promote_for_execution does, on a 1 s sweep (FlowFabric's
// Postgres backend has no such sweep: without it a delayed execution whose
// promotion nobody scheduled would stay delayed) and on request from other
// services (jobs.PromoteArgs).
//
// The sweep enqueues the same PromoteArgs other services use, in the
// partition + execution_id form and without "at", so a sweep and an ad-hoc
// promotion of that form for the same execution share one unique key.
var DelayedPromotion = define[jobs.DelayedPromotionTickArgs, jobs.DelayedPromotionScanArgs](Reconciler{
	Name:     "delayed_promotion",
	Interval: time.Second,
	Due:      store.DelayedExecutions,
	Tables:   []string{"ff_exec_core"},
	// ffreconcile_promote: the function other services call to enqueue a
	// promotion in one SQL call (migrations/delayed_promotion.go), whose
	// jobs every fleet works, ticking promotions or not; one older than
	// this build's would insert jobs unlike the Go clients'.
	AlwaysNeeds: []string{"ffreconcile_promote"},
	Lookahead:   true,
	NoOpReasons: []NoOpReason{NoOpNoLongerDue, NoOpGone, NoOpNotDueYet, NoOpLostRace},
}, func(p int16, x store.DueRow) jobs.PromoteArgs {
	return jobs.PromoteArgs{Partition: &p, ExecutionID: x.ID}
}, func(d *deps) river.Worker[jobs.PromoteArgs] {
	return &promoteWorker{d: d, promotions: batcher(d, func(ctx context.Context, p int16, ids []string) ([]store.PromoteResult, error) {
		return store.PromoteDelayedMany(ctx, d.cfg.Pool, p, ids, store.NowMs(), d.cfg.Filter)
	})}
})

// promoteWorker promotes one delayed execution: the sweep's row job and the
// ad-hoc promotion other services enqueue.
type promoteWorker struct {
	rowDefaults[jobs.PromoteArgs]
	d          *deps
	promotions *coalesce.Coalescer[int16, string, store.PromoteResult]
}

func (w *promoteWorker) Work(ctx context.Context, job *river.Job[jobs.PromoteArgs]) error {
	c := w.d.stats(DelayedPromotion)
	target, err := job.Args.Target()
	if err != nil {
		// validating cancels invalid args before Work runs; this only
		// guards a worker registered without it.
		c.Skipped.Add(1)
		return river.JobCancel(err)
	}
	log := w.d.log().With("reconciler", DelayedPromotion.Name, "execution", target.String(), "job_id", job.ID)
	// An ad-hoc promotion is inserted ahead of its "at" (see
	// jobs.PromoteArgs.InsertOpts) and waits here for it.
	if at := job.Args.At; at != nil {
		if wait := time.Until(*at); wait > 0 {
			log.Debug("promotion scheduled later; snoozing until its at", "at", *at, "snooze", snoozeFor(wait))
			return w.d.snooze(DelayedPromotion, snoozeFor(wait))
		}
	}
	res, err := w.promotions.Do(ctx, target.Partition, target.UUID)
	if err != nil {
		c.Errors.Add(1)
		return err
	}
	if res.Promoted() {
		var deadline int64
		if res.DeadlineAtMs != nil {
			deadline = *res.DeadlineAtMs
		}
		w.d.applied(DelayedPromotion, deadline)
		log.Debug("promoted delayed execution to eligible_now")
		jobLog(ctx).Info("promoted delayed execution to eligible_now")
		return nil
	}
	if err := w.d.checkTenant(ctx, DelayedPromotion, target.Partition, store.DueRow{ID: target.UUID}, log); err != nil {
		return err
	}
	switch res.Outcome {
	case store.PromoteMissing:
		c.NoOp(NoOpGone)
	case store.PromoteNotDue:
		c.NoOp(NoOpNotDueYet)
	case store.PromoteRaced:
		c.NoOp(NoOpLostRace)
	default:
		c.NoOp(NoOpNoLongerDue)
	}
	if res.Outcome == store.PromoteNotDue && res.DeadlineAtMs != nil {
		wait := time.Until(time.UnixMilli(*res.DeadlineAtMs))
		snoozes := snoozeCount(job.Metadata)
		if wait <= MaxPromoteSnooze && snoozes < MaxPromoteSnoozes {
			log.Debug("execution not due yet; snoozing until its delay-until",
				"deadline_at_ms", *res.DeadlineAtMs, "snooze", snoozeFor(wait), "snoozes", snoozes)
			jobLog(ctx).Info("execution not due yet; snoozing until its delay-until", "execution", target.String(),
				"delay_until_ms", *res.DeadlineAtMs)
			return w.d.snooze(DelayedPromotion, snoozeFor(wait))
		}
	}
	log.Debug("nothing to promote", "outcome", string(res.Outcome), "lifecycle_phase", res.LifecyclePhase,
		"eligibility_state", res.EligibilityState, "deadline_at_ms", res.DeadlineAtMs)
	jobLog(ctx).Info("nothing to promote", "outcome", string(res.Outcome))
	return nil
}

// snoozeFor is the snooze that runs a job again as soon as wait has passed.
// River makes a snoozed job available at once when its snooze is at most
// its scheduler's interval (then the next fetch after the time takes it),
// and leaves longer ones to the scheduler, which runs only every
// jobs.RiverSchedulerInterval: a longer wait is split, first up to one
// interval before the time, then the rest.
func snoozeFor(wait time.Duration) time.Duration {
	if wait <= jobs.RiverSchedulerInterval {
		return max(wait, time.Millisecond)
	}
	return wait - jobs.RiverSchedulerInterval
}

// snoozeCount is the number of times River recorded the job as snoozed, in
// its metadata's "snoozes"; unreadable metadata counts as none.
func snoozeCount(metadata []byte) int64 {
	var m struct {
		Snoozes int64 `json:"snoozes"`
	}
	_ = json.Unmarshal(metadata, &m)
	return m.Snoozes
}
