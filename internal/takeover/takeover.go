// Package takeover hands on what a fleet process held when it died without a
// clean stop: its River leadership and its running jobs.
//
// River learns that a client died only through time. Its leadership row
// expires 15 s after its last re-election (River's elector interval plus
// padding, neither configurable in v0.51) and the others bid every 5-6 s, so
// ticks stop for 15-21 s; its running jobs wait until they have run longer
// than RescueStuckJobsAfter and River's rescuer, every 30 s, finds them. The
// fleet knows sooner: every connection of a process carries its tag
// (store.ConnTagged), and a process none of whose connections is left is
// gone (store.DepartedWorkers). The heartbeat of every other process looks
// at each beat and calls TakeOver, which does what River would do once its
// timers ran out, through River's own statements:
//
//   - the leadership is resigned on the dead leader's behalf, as River's
//     elector resigns it on a clean stop (the driver's LeaderResign: delete
//     the row if it is still that term's, and notify), so the others elect
//     a new leader at once;
//   - each running job of the dead process is rescued as River's rescuer
//     rescues a stuck job (the driver's JobRescueMany): cancelled if a
//     cancel was requested, discarded if its attempts are spent, otherwise
//     retried after the client's retry policy's delay for the attempt.
//
// River's driver marks these methods "API is not stable"; River is pinned
// (go.mod) and the tests run them against River's real schema, so an
// upgrade that changes them fails the build or the tests, not production.
// Acting on a live process by mistake (every one of its connections lost
// at once) costs a leader election and a job run twice, both of which River
// itself allows for and every row action tolerates (it re-checks its row
// under lock).
package takeover

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/rivertype"

	"github.com/flowfabric/ffreconcile/store"
)

// LeadershipTopic is the topic of River's leadership notifications; the
// channel is "<schema>." + LeadershipTopic (River v0.51's
// notifier.NotificationTopicLeadership, which River does not export;
// TestLeadershipTopicIsRivers fails if it changes).
const LeadershipTopic = "river_leadership"

// maxJobs bounds the jobs one TakeOver rescues; the rest, if ever there
// were more, are rescued at the next beat (the heartbeat row is deleted
// only once TakeOver found fewer).
const maxJobs = 1000

// Config configures a Taker.
type Config struct {
	// Client is the process's River client: its driver runs River's
	// statements, its JobList reads the jobs. Required.
	Client *river.Client[pgx.Tx]
	// DB reads River's running jobs (River's pool). Required.
	DB store.DB
	// RetryPolicy decides when a rescued job runs again, as the rescuer's
	// client's does. Defaults to River's default policy.
	RetryPolicy river.ClientRetryPolicy
	// Wake, when set, is called with the time a retried job falls due, so
	// the queue's producers fetch it then rather than at their next poll.
	Wake func(time.Time)
	// Logger receives what was taken over. Defaults to slog.Default().
	Logger *slog.Logger
}

// Taker takes over from dead processes; its counters say what it did.
type Taker struct {
	cfg Config

	processes, leaderships           atomic.Int64
	retried, discarded, cancelledJob atomic.Int64
}

// New returns a Taker.
func New(cfg Config) (*Taker, error) {
	if cfg.Client == nil || cfg.DB == nil {
		return nil, errors.New("takeover: Client and DB are required")
	}
	if cfg.RetryPolicy == nil {
		cfg.RetryPolicy = &river.DefaultClientRetryPolicy{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Taker{cfg: cfg}, nil
}

// Result is what one TakeOver did.
type Result struct {
	// Resigned: the process was River's leader and its term was ended.
	Resigned bool
	// Retried, Discarded and Cancelled count its running jobs by what
	// became of them.
	Retried, Discarded, Cancelled int
	// More: it had more running jobs than one call rescues; call again.
	More bool
}

// Counts is what a Taker did since it was made.
type Counts struct {
	Processes, Leaderships, Retried, Discarded, Cancelled int64
}

// Counts returns what t did so far.
func (t *Taker) Counts() Counts {
	return Counts{
		Processes: t.processes.Load(), Leaderships: t.leaderships.Load(),
		Retried: t.retried.Load(), Discarded: t.discarded.Load(), Cancelled: t.cancelledJob.Load(),
	}
}

// TakeOver ends the leadership of the departed process w, if it holds one,
// and rescues its running jobs (those of its client ID started before
// w.SeenAt). Running it twice, or from two processes at once, does each
// thing once: the resignation deletes only the term w was elected in, and a
// rescue only updates jobs still running in an attempt that started no
// later than the latest one read.
func (t *Taker) TakeOver(ctx context.Context, w store.DepartedWorker) (Result, error) {
	var res Result
	schema := t.cfg.Client.Schema()
	exec := t.cfg.Client.Driver().GetExecutor()
	if !w.LeaderElectedAt.IsZero() {
		resigned, err := exec.LeaderResign(ctx, &riverdriver.LeaderResignParams{
			ElectedAt: w.LeaderElectedAt, LeaderID: w.ClientID, LeadershipTopic: LeadershipTopic, Schema: schema,
		})
		if err != nil {
			return res, fmt.Errorf("resign the leadership of %s: %w", w.ClientID, err)
		}
		res.Resigned = resigned
	}
	// Only attempts started before the process was found dead: one
	// started since is a successor's, restarted under the same client ID.
	seen := w.SeenAt
	if seen.IsZero() {
		seen = time.Now()
	}
	ids, err := store.RunningJobsOf(ctx, t.cfg.DB, schema, w.ClientID, seen, maxJobs)
	if err != nil {
		return res, err
	}
	res.More = len(ids) == maxJobs
	if len(ids) > 0 {
		if err := t.rescue(ctx, exec, schema, w.ClientID, seen, ids, &res); err != nil {
			return res, err
		}
	}
	if res.Resigned {
		t.leaderships.Add(1)
	}
	t.processes.Add(1)
	t.retried.Add(int64(res.Retried))
	t.discarded.Add(int64(res.Discarded))
	t.cancelledJob.Add(int64(res.Cancelled))
	if !res.Resigned && res.Retried+res.Discarded+res.Cancelled == 0 {
		// Another process took over first, or it held nothing.
		t.cfg.Logger.Info("worker process gone without a clean stop (no connection of it left); nothing left to take over",
			"client_id", w.ClientID, "started_at", w.StartedAt)
		return res, nil
	}
	t.cfg.Logger.Warn("took over from a worker process gone without a clean stop (no connection of it left)",
		"client_id", w.ClientID, "started_at", w.StartedAt, "leadership_resigned", res.Resigned,
		"jobs_retried", res.Retried, "jobs_discarded", res.Discarded, "jobs_cancelled", res.Cancelled)
	return res, nil
}

// rescue decides, for each job, what River's rescuer would, and applies it
// with River's rescue statement.
func (t *Taker) rescue(ctx context.Context, exec riverdriver.Executor, schema, clientID string, seen time.Time, ids []int64, res *Result) error {
	list, err := t.cfg.Client.JobList(ctx, river.NewJobListParams().IDs(ids...).States(rivertype.JobStateRunning).First(len(ids)))
	if err != nil {
		return fmt.Errorf("read the running jobs of %s: %w", clientID, err)
	}
	now := time.Now().UTC()
	p := riverdriver.JobRescueManyParams{Schema: schema}
	var horizon time.Time
	for _, job := range list.Jobs {
		// JobList read the jobs after RunningJobsOf: skip one another
		// process has taken since (its attempt is not clientID's).
		if job.AttemptedAt == nil || !job.AttemptedAt.Before(seen) || len(job.AttemptedBy) == 0 ||
			job.AttemptedBy[len(job.AttemptedBy)-1] != clientID {
			continue
		}
		if job.AttemptedAt.After(horizon) {
			horizon = *job.AttemptedAt
		}
		errJSON, err := json.Marshal(rivertype.AttemptError{
			At: now, Attempt: max(job.Attempt, 0),
			Error: "worker process " + clientID + " is gone without a clean stop (no connection of it left); job taken over",
		})
		if err != nil {
			return err
		}
		state, finalized, scheduled := rivertype.JobStateAvailable, (*time.Time)(nil), time.Time{}
		switch {
		case cancelAttempted(job.Metadata):
			state, finalized, scheduled = rivertype.JobStateCancelled, &now, job.ScheduledAt
			res.Cancelled++
		case job.Attempt >= job.MaxAttempts:
			state, finalized, scheduled = rivertype.JobStateDiscarded, &now, job.ScheduledAt
			res.Discarded++
		default:
			// Available with a future scheduled_at: fetched once it
			// passes, without waiting for River's scheduler (5 s), as
			// the fleet's row jobs enqueued ahead are.
			scheduled = t.cfg.RetryPolicy.NextRetry(job).UTC().Truncate(time.Microsecond) // as stored
			res.Retried++
			if t.cfg.Wake != nil {
				t.cfg.Wake(scheduled)
			}
		}
		p.ID = append(p.ID, job.ID)
		p.Error = append(p.Error, errJSON)
		p.FinalizedAt = append(p.FinalizedAt, finalized)
		p.ScheduledAt = append(p.ScheduledAt, scheduled)
		p.State = append(p.State, string(state))
	}
	if len(p.ID) == 0 {
		return nil
	}
	// Only attempts that started no later than the latest one read: if
	// another process took one of these jobs over and a third has started
	// it again since, that new attempt is newer and is left alone.
	p.StuckHorizon = horizon.Add(time.Microsecond)
	if _, err := exec.JobRescueMany(ctx, &p); err != nil {
		return fmt.Errorf("rescue the running jobs of %s: %w", clientID, err)
	}
	return nil
}

// cancelAttempted reports whether River recorded a cancel request for a job
// (metadata cancel_attempted_at), which the rescuer honours by cancelling.
func cancelAttempted(metadata []byte) bool {
	var m struct {
		CancelAttemptedAt *time.Time `json:"cancel_attempted_at"`
	}
	return json.Unmarshal(metadata, &m) == nil && m.CancelAttemptedAt != nil && !m.CancelAttemptedAt.IsZero()
}
