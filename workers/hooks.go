package workers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
)

// Hooks returns the hooks for river.Config.Hooks:
//
//   - args of every reconciler's kinds are validated at insert (the insert
//     fails with the reason): args of this project's types as the value the
//     client encoded, any other type with one of these kinds from its JSON.
//     They are validated again when a job starts (see validating and
//     Middleware), which catches jobs inserted by other clients (a non-Go
//     River client, raw SQL);
//   - row jobs scheduled within River's scheduler interval are inserted
//     available instead of scheduled (see availableAhead).
func (s *Set) Hooks() []rivertype.Hook {
	return []rivertype.Hook{river.HookInsertBeginFunc(validateOnInsert), river.HookInsertBeginFunc(availableAhead),
		river.HookInsertBeginFunc(s.d.tagOnInsert)}
}

// tagOnInsert tags every job of this fleet's kinds it inserts with its
// reconciler's name and, in a filtered fleet, its tenant (TenantTag), so
// River UI's tag filter finds one reconciler's or one tenant's jobs.
// River validates tags before its hooks run, so these are made valid here.
func (d *deps) tagOnInsert(_ context.Context, params *rivertype.JobInsertParams) error {
	r, _, ok := ByKind(params.Kind)
	if !ok {
		return nil
	}
	for _, tag := range []string{r.Name, TenantTag(d.cfg.Filter)} {
		if tag != "" && !slices.Contains(params.Tags, tag) {
			params.Tags = append(params.Tags, tag)
		}
	}
	return nil
}

// TenantTag is the River tag of a filtered fleet's jobs: "tenant-" and
// the namespace and instance tag value, each character River refuses in a
// tag (anything but letters, digits, '_' and '-') replaced by '_'; "" for
// no filter.
func TenantTag(f store.Filter) string {
	if f.Empty() {
		return ""
	}
	parts := []string{"tenant"}
	for _, p := range []string{f.Namespace, f.TagValue} {
		if p != "" {
			parts = append(parts, p)
		}
	}
	tag := []rune(strings.Join(parts, "-"))
	for i, c := range tag {
		if !(unicode.IsLetter(c) || unicode.IsDigit(c) || c == '_' || c == '-') {
			tag[i] = '_'
		}
	}
	if len(tag) > 255 {
		tag = tag[:255]
	}
	if tag[len(tag)-1] == '-' { // River's tags end in a letter, digit or '_'
		tag[len(tag)-1] = '_'
	}
	return string(tag)
}

// validateOnInsert validates the args of a job of one of the reconcilers'
// kinds.
func validateOnInsert(_ context.Context, params *rivertype.JobInsertParams) error {
	r, _, ok := ByKind(params.Kind)
	if !ok {
		return nil
	}
	if v, typed := params.Args.(jobs.Validator); typed {
		if err := v.Validate(); err != nil {
			return fmt.Errorf("invalid %s job: %w", params.Kind, err)
		}
		return nil
	}
	if validate := r.validateJSON[params.Kind]; validate != nil {
		return validate(params.EncodedArgs)
	}
	return nil
}

// validateEncoded validates stored args of a job of one of the reconcilers'
// kinds; other kinds pass.
func validateEncoded(kind string, encoded []byte) error {
	r, _, ok := ByKind(kind)
	if !ok {
		return nil
	}
	if validate := r.validateJSON[kind]; validate != nil {
		return validate(encoded)
	}
	return nil
}

// availableAhead inserts a row job scheduled at most
// jobs.RiverSchedulerInterval from now as available, keeping its
// scheduled_at, instead of scheduled. River's fetch takes an available job
// only once its scheduled_at has passed, and River itself leaves jobs in
// that state: its scheduler makes scheduled jobs available up to one
// interval before their time, and a snooze that short stays available.
// Inserted as scheduled, a job due in a second would wait for the leader's
// scheduler, which runs every 5 s, and start up to 5 s late.
func availableAhead(_ context.Context, params *rivertype.JobInsertParams) error {
	if params.Queue == jobs.QueueRows && params.State == rivertype.JobStateScheduled && params.ScheduledAt != nil &&
		time.Until(*params.ScheduledAt) <= jobs.RiverSchedulerInterval {
		params.State = rivertype.JobStateAvailable
	}
	return nil
}

// Middleware returns the workers' River middleware, for
// river.Config.Middleware.
//
// Ticks are serialised within a process: each tick's query plans over all
// 256 children of its table and takes an AccessShareLock on every child and
// each of its indexes until it returns. Several reconcilers ticking at once
// (they all run on start) would need most of a default lock table
// (max_locks_per_transaction 64 × max_connections 100 = 6,400 slots) and
// fail with "out of shared memory" next to other work. One at a time they
// stay far below it. Their queue (jobs.QueueTicks) has TickWorkers per
// process so that the ticks due at one instant come in one fetch; the
// others wait here for the one running, at most TickWait each. The lock
// also covers ticks an earlier version enqueued into the scans' queue,
// during a rolling upgrade.
//
// A job whose args River could not decode never reaches its worker (see
// validating) and fails before it; the middleware then cancels it with the
// reason instead of leaving it to River's retries, which would fail the same
// way every time.
func (s *Set) Middleware() []rivertype.Middleware {
	return []rivertype.Middleware{river.WorkerMiddlewareFunc(
		func(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
			if _, step, ok := ByKind(job.Kind); ok && step == StepTick {
				if err := s.d.awaitTick(ctx); err != nil {
					s.d.logFailed(job, err)
					return err
				}
				defer func() { <-s.d.tickSem }()
			}
			var decoded bool
			err := doInner(context.WithValue(ctx, argsDecodedKey{}, &decoded))
			if err != nil && !decoded {
				if verr := validateEncoded(job.Kind, job.EncodedArgs); verr != nil {
					return s.d.cancelInvalid(job, verr)
				}
			}
			if err != nil {
				s.d.logFailed(job, err)
			}
			return err
		})}
}

// awaitTick waits until no other tick of this process runs, at most
// tickWait (River's job timeout starts only after the middleware, so the
// wait has its own bound); the caller then releases tickSem.
func (d *deps) awaitTick(ctx context.Context) error {
	select { // the usual case: no tick runs
	case d.tickSem <- struct{}{}:
		return nil
	default:
	}
	t := time.NewTimer(d.tickWait)
	defer t.Stop()
	select {
	case d.tickSem <- struct{}{}:
		return nil
	case <-t.C:
		return fmt.Errorf("waited %s for the ticks ahead of it in this process", d.tickWait)
	case <-ctx.Done():
		return fmt.Errorf("waiting for the ticks ahead of it in this process: %w", ctx.Err())
	}
}

// logFailed logs a job that failed and will be retried or discarded by
// River: River logs it at info, which an operator running at warn (and the
// tests) would not see. Cancels and snoozes are outcomes, not failures.
func (d *deps) logFailed(job *rivertype.JobRow, err error) {
	var cancel *rivertype.JobCancelError
	var snooze *rivertype.JobSnoozeError
	if errors.As(err, &cancel) || errors.As(err, &snooze) {
		return
	}
	name := job.Kind
	if r, _, ok := ByKind(job.Kind); ok {
		name = r.Name
	}
	d.log().Warn("job failed; River retries it until its attempts run out", "reconciler", name, "kind", job.Kind,
		"job_id", job.ID, "attempt", job.Attempt, "max_attempts", job.MaxAttempts, "error", err)
}

// argsDecodedKey carries, from Middleware to validating, the flag saying
// River decoded the job's args and handed them to the worker.
type argsDecodedKey struct{}

// validating wraps every worker: it validates the args River has just
// decoded for it and cancels a job whose args are invalid, with its reason
// (visible in River UI) instead of retrying it. Validating the decoded value
// saves decoding the JSON once more in a work-begin hook.
type validating[T river.JobArgs] struct {
	river.Worker[T]
	d *deps
}

// Work implements river.Worker.
func (w *validating[T]) Work(ctx context.Context, job *river.Job[T]) error {
	if decoded, ok := ctx.Value(argsDecodedKey{}).(*bool); ok {
		*decoded = true
	}
	if v, ok := any(job.Args).(jobs.Validator); ok {
		if err := v.Validate(); err != nil {
			return w.d.cancelInvalid(job.JobRow, fmt.Errorf("invalid %s job: %w", job.Kind, err))
		}
	}
	return w.Worker.Work(ctx, job)
}

// addWorker registers w, wrapped in validating.
func addWorker[T river.JobArgs](ws *river.Workers, d *deps, w river.Worker[T]) error {
	return river.AddWorkerSafely[T](ws, &validating[T]{Worker: w, d: d})
}

// cancelInvalid counts and logs a job with invalid args and cancels it.
func (d *deps) cancelInvalid(job *rivertype.JobRow, err error) error {
	name := job.Kind
	if r, _, ok := ByKind(job.Kind); ok {
		name = r.Name
	}
	d.cfg.Stats.For(name).Skipped.Add(1)
	d.log().Warn("cancelling job with invalid args", "kind", job.Kind, "job_id", job.ID,
		"args", string(job.EncodedArgs), "error", err)
	return river.JobCancel(err)
}
