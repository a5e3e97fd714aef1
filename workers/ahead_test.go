package workers_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/internal/fleettest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

// TestRowsFallingDueSoonStartAtTheirDeadline: a tick finds a row due within
// its lookahead and enqueues its row job at once, scheduled one millisecond
// after the deadline; the job starts no earlier than that and applies the
// action (no no-op from an early start). A row due beyond the window gets no
// job. The waker sends a wake-up for the deadline (what starts the job
// when River's poll is further off).
//
// The fleet's clock stands still until the row is enqueued ahead, so the
// row is not yet due at the tick however late the tick runs on a loaded
// machine (with the wall clock, a tick later than the 2.5 s margin found it
// due and the test failed).
func TestRowsFallingDueSoonStartAtTheirDeadline(t *testing.T) {
	t.Parallel()
	for _, tt := range deadlineRows {
		if !tt.r.Lookahead {
			continue
		}
		t.Run(tt.r.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.New(t)
			f, c := startLookingAhead(t, db, tt.r, 3*time.Second) // a 4 s window

			deadline := freezeUntilEnqueuedAhead(f, c) + 2500
			soon := tt.insert(t, db.Pool, 7, deadline)
			far := tt.insert(t, db.Pool, 8, deadline+60_000)

			fleettest.WaitFor(t, fleettest.Patient, "the row due soon to be acted on", func() (bool, string) {
				return tt.acted(t, db.Pool, 7, soon), fleettest.Statusf("%+v", c.Snapshot())
			})
			var scheduledAt, attemptedAt time.Time
			var n int
			var deadlineArg bool
			err := db.Pool.QueryRow(ctx, `
				SELECT count(*) OVER (), scheduled_at, attempted_at, args ? 'deadline_ms' FROM river.river_job
				 WHERE kind = $1 AND args->>$3 = $2`, tt.r.RowKind(), soon, tt.idArg).Scan(&n, &scheduledAt, &attemptedAt, &deadlineArg)
			if err != nil {
				t.Fatal(err)
			}
			if want := time.UnixMilli(deadline + 1); n != 1 || !scheduledAt.Equal(want) {
				t.Fatalf("%d row jobs, scheduled at %s; want one, scheduled at %s", n, scheduledAt, want)
			}
			// The schedule carries the deadline (jobDeadlineMs); a
			// deadline_ms too would cost river_job's args index an entry.
			if deadlineArg {
				t.Fatal("the row job enqueued ahead has deadline_ms in its args; want its schedule alone to carry it")
			}
			if attemptedAt.Before(scheduledAt) {
				t.Fatalf("row job started at %s, before its deadline's %s", attemptedAt, scheduledAt)
			}
			// The scan counts its jobs after their insert commits, so
			// the job can be done before it is counted.
			waitApplied(t, c, 1)
			fleettest.WaitFor(t, fleettest.Patient, "the row job counted as enqueued ahead", func() (bool, string) {
				return c.EnqueuedAhead.Load() > 0, fleettest.Statusf("%+v", c.Snapshot())
			})
			if st := c.Snapshot(); st.EnqueuedAhead != 1 || st.Applied != 1 || st.NoOps != 0 {
				t.Fatalf("stats %+v; want 1 row enqueued ahead, applied once, no no-op", st)
			}
			if tt.acted(t, db.Pool, 8, far) {
				t.Fatal("the row due in a minute was acted on")
			}
			if n := fftest.Count(t, db.Pool, `SELECT count(*) FROM river.river_job WHERE args->>$2 = $1`, far, tt.idArg); n != 0 {
				t.Fatalf("%d jobs for the row due in a minute, beyond the lookahead; want none", n)
			}
			// The waker sends from a goroutine of its own: a scan late on
			// a loaded machine inserts a job already due, which River's
			// insert notification can start before the wake-up goes.
			fleettest.WaitFor(t, fleettest.Patient, "the wake-up sent", func() (bool, string) {
				return f.Waker.Sent() > 0, fleettest.Statusf("%d wake-ups pending", f.Waker.Pending())
			})
		})
	}
}

// TestRowJobStartedBeforeItsDeadlineWaitsForIt: a row job that starts
// before its deadline (in production by clock skew between the database and
// the process) snoozes until the deadline and then applies its action,
// instead of finding the row not due and leaving it to a later tick. The
// deadline reaches the job two ways: in its args (deadline_ms; here the job
// is inserted without a schedule, so it starts at once), or, as a scan
// enqueues a row ahead, as its schedule one millisecond after the deadline
// with no deadline_ms (jobDeadlineMs). No tick runs and River polls only
// once a minute, so the second start is the waker's doing.
//
// The process's clock stands still until the first snooze, so the job's
// first start is before its deadline however late it starts. Were the
// schedule not read as the deadline, the scheduled job would start after it
// by the database's clock, apply at once, and never snooze.
func TestRowJobStartedBeforeItsDeadlineWaitsForIt(t *testing.T) {
	t.Parallel()
	ways := []struct {
		name string
		// insert enqueues the row job of row id of tt for deadline.
		insert func(ctx context.Context, f *fleet.Fleet, tt deadlineRow, id string, deadline int64) (*rivertype.JobInsertResult, error)
	}{
		{"args", func(ctx context.Context, f *fleet.Fleet, tt deadlineRow, id string, deadline int64) (*rivertype.JobInsertResult, error) {
			return f.Client.Insert(ctx, tt.rowJob(3, id, deadline), nil)
		}},
		{"schedule", func(ctx context.Context, f *fleet.Fleet, tt deadlineRow, id string, deadline int64) (*rivertype.JobInsertResult, error) {
			at := time.UnixMilli(deadline + 1)
			res, err := f.Client.Insert(ctx, tt.rowJob(3, id, 0), &river.InsertOpts{ScheduledAt: at})
			f.Waker.At(at) // as the scan asks, else the first start waits for River's poll
			return res, err
		}},
	}
	for _, tt := range deadlineRows {
		if tt.rowJob == nil {
			continue // the promotion's re-check snoozes on its own (TestEarlyPromotionSnoozesUntilDue)
		}
		for _, way := range ways {
			t.Run(tt.r.Name+"/"+way.name, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				db := testdb.New(t)
				f := fleettest.Start(t, db, fleet.Config{Reconcilers: noSweep(), FetchPollInterval: time.Minute})
				c := f.Workers.Stats().For(tt.r.Name)
				t0 := time.Now()
				f.Workers.StubClock(func() time.Time {
					if c.Snoozes.Load() == 0 {
						return t0
					}
					return time.Now()
				})
				deadline := t0.UnixMilli() + 1500
				id := tt.insert(t, db.Pool, 3, deadline)
				res, err := way.insert(ctx, f, tt, id, deadline)
				if err != nil {
					t.Fatal(err)
				}
				fleettest.WaitFor(t, fleettest.Patient, "the row acted on", func() (bool, string) {
					return tt.acted(t, db.Pool, 3, id), fleettest.Statusf("%+v", readJob(t, db.Pool, res.Job.ID))
				})
				if j := waitJobState(t, db.Pool, res.Job.ID, "completed"); j.Snoozes != 1 || j.Attempt != 1 {
					t.Fatalf("job = %+v; want completed in one attempt after one snooze", j)
				}
				waitApplied(t, f.Workers.Stats().For(tt.r.Name), 1)
				if st := f.Workers.Stats().For(tt.r.Name).Snapshot(); st.Applied != 1 || st.NoOps != 0 || st.Snoozes != 1 {
					t.Fatalf("stats %+v; want applied once after one snooze", st)
				}
			})
		}
	}
}

// TestBusyPartitionStillEnqueuesRowsAhead: a partition whose due row's job
// is still waiting in the queue is not scanned again for due rows, but a row
// of it falling due within the lookahead is still enqueued ahead, scheduled
// for its deadline, by a scan starting after the rows due at the tick. The
// rows queue is paused to hold the due row's job in the queue.
func TestBusyPartitionStillEnqueuesRowsAhead(t *testing.T) {
	t.Parallel()
	for _, tt := range deadlineRows {
		if !tt.r.Lookahead {
			continue
		}
		t.Run(tt.r.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.New(t)
			f, c := startBusy(t, db, tt.r, 3*time.Second)
			jobOf := func(id string) (state string, scheduledAt time.Time) {
				err := db.Pool.QueryRow(ctx, `SELECT state, scheduled_at FROM river.river_job WHERE kind = $1 AND args->>$3 = $2`,
					tt.r.RowKind(), id, tt.idArg).Scan(&state, &scheduledAt)
				if err != nil && !errors.Is(err, pgx.ErrNoRows) {
					t.Fatal(err)
				}
				return state, scheduledAt
			}

			due := tt.insert(t, db.Pool, 5, store.NowMs()-1000)
			fleettest.WaitFor(t, fleettest.Patient, "the due row's job queued", func() (bool, string) {
				state, _ := jobOf(due)
				return state == "available", "job state " + state
			})
			ticks := c.Ticks.Load()
			fleettest.WaitFor(t, fleettest.Patient, "two more ticks", func() (bool, string) {
				return c.Ticks.Load() >= ticks+2, fleettest.Statusf("%+v", c.Snapshot())
			})
			if state, _ := jobOf(due); state != "available" {
				t.Fatalf("the due row's job is %s; the paused queue should hold it available", state)
			}

			// The fleet's clock stands still until the row is enqueued
			// ahead: however late the next tick, the row is not yet due.
			deadline := freezeUntilEnqueuedAhead(f, c) + 2500
			soon := tt.insert(t, db.Pool, 5, deadline)
			// The scan counts the row job after its insert commits: the
			// test can see the job before the count (a loaded run saw Enqueued 1,
			// EnqueuedAhead 0 here), so it waits for both.
			fleettest.WaitFor(t, fleettest.Patient, "the row due soon enqueued ahead despite the busy partition", func() (bool, string) {
				state, _ := jobOf(soon)
				return state != "" && c.EnqueuedAhead.Load() > 0, fleettest.Statusf("job state %q; %+v", state, c.Snapshot())
			})
			if _, at := jobOf(soon); !at.Equal(time.UnixMilli(deadline + 1)) {
				t.Fatalf("row job scheduled at %s; want %s", at, time.UnixMilli(deadline+1))
			}
			if state, _ := jobOf(due); state != "available" {
				t.Fatalf("the due row's job is %s; want it still queued (the partition busy)", state)
			}
			if st := c.Snapshot(); st.EnqueuedAhead != 1 || st.Enqueued != 2 {
				t.Fatalf("stats %+v; want 2 row jobs, 1 of them ahead", st)
			}

			if err := f.Client.QueueResume(ctx, jobs.QueueRows, nil); err != nil {
				t.Fatal(err)
			}
			fleettest.WaitFor(t, fleettest.Patient, "both rows acted on", func() (bool, string) {
				return tt.acted(t, db.Pool, 5, due) && tt.acted(t, db.Pool, 5, soon), fleettest.Statusf("%+v", c.Snapshot())
			})
			waitApplied(t, c, 2)
			if st := c.Snapshot(); st.Applied != 2 || st.NoOps != 0 {
				t.Fatalf("stats %+v; want 2 applied, no no-op", st)
			}
		})
	}
}

// TestRowQueuedAheadIsNotOfferedAgain: a row enqueued ahead stays in the
// window of the next ticks; their scans skip it instead of offering it to
// River's uniqueness check again, which would rewrite the queued job's row
// (INSERT … ON CONFLICT DO UPDATE): the job's xmin does not change while
// the skips are counted as already queued.
//
// The row falls due in a minute, while the fleet's clock stands 4.5 s before
// it: its job stays queued however slowly the ticks come.
func TestRowQueuedAheadIsNotOfferedAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	tt := deadlineRows[0]
	f, c := startLookingAhead(t, db, tt.r, 4*time.Second) // a 5 s window
	deadline := time.Now().Add(time.Minute)
	f.Workers.StubClock(func() time.Time { return deadline.Add(-4500 * time.Millisecond) })
	id := tt.insert(t, db.Pool, 4, deadline.UnixMilli())
	xmin := func() string {
		var x string
		err := db.Pool.QueryRow(ctx, `SELECT xmin::text FROM river.river_job WHERE kind = $1 AND args->>$3 = $2`, tt.r.RowKind(), id, tt.idArg).Scan(&x)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		return x
	}
	fleettest.WaitFor(t, fleettest.Patient, "the row enqueued ahead", func() (bool, string) {
		return xmin() != "", fleettest.Statusf("%+v", c.Snapshot())
	})
	first := xmin()
	fleettest.WaitFor(t, fleettest.Patient, "a later scan finding the row queued", func() (bool, string) {
		// EnqueuedAhead too: the first scan counts its job after the commit.
		return c.AlreadyQueued.Load() > 0 && c.EnqueuedAhead.Load() > 0, fleettest.Statusf("%+v", c.Snapshot())
	})
	if got := xmin(); got != first {
		t.Fatalf("the queued job's row was rewritten (xmin %s → %s): the row was offered to River again", first, got)
	}
	if st := c.Snapshot(); st.Enqueued != 1 || st.EnqueuedAhead != 1 {
		t.Fatalf("stats %+v; want one row job, enqueued ahead", st)
	}
}

// freezeUntilEnqueuedAhead stubs the clock of f's ticks and scans to stand
// still at the current time until c counts a row job enqueued ahead, and
// returns that time (ms). Row jobs keep the real clock: the scan counts its
// jobs after their insert commits, and a job started on time in between
// once read the frozen clock, found itself 2.5 s early and snoozed (a CI
// run: scheduled 2.7 s after its deadline).
func freezeUntilEnqueuedAhead(f *fleet.Fleet, c *workers.Counters) int64 {
	t0 := time.Now()
	f.Workers.StubScanClock(func() time.Time {
		if c.EnqueuedAhead.Load() == 0 {
			return t0
		}
		return time.Now()
	})
	return t0.UnixMilli()
}

// TestJobDeadlineMs: where a row job's deadline is read from. A regression
// that read a River-given schedule (created and scheduled at once) or a
// retry's backoff as the deadline would record a queue wait or a backoff as
// lateness, and snooze jobs started by skew for nothing.
func TestJobDeadlineMs(t *testing.T) {
	t.Parallel()
	created := time.UnixMilli(1_767_000_000_000)
	tests := []struct {
		name   string
		job    rivertype.JobRow
		argsMs int64
		want   int64
	}{
		{"args", rivertype.JobRow{CreatedAt: created, ScheduledAt: created}, 1_766_999_990_000, 1_766_999_990_000},
		{"args over a schedule", rivertype.JobRow{CreatedAt: created, ScheduledAt: created.Add(time.Second)}, 42, 42},
		{"enqueued ahead", rivertype.JobRow{CreatedAt: created, ScheduledAt: created.Add(2500 * time.Millisecond)}, 0, 1_767_000_002_499},
		{"scheduled before its creation (the process's clock behind the database's)", rivertype.JobRow{CreatedAt: created, ScheduledAt: created.Add(-5 * time.Millisecond)}, 0, 1_766_999_999_994},
		{"scheduled by River", rivertype.JobRow{CreatedAt: created, ScheduledAt: created}, 0, 0},
		{"retried", rivertype.JobRow{CreatedAt: created, ScheduledAt: created.Add(time.Minute), Errors: []rivertype.AttemptError{{Attempt: 1}}}, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := workers.JobDeadlineMs(&tt.job, tt.argsMs); got != tt.want {
				t.Fatalf("JobDeadlineMs = %d; want %d", got, tt.want)
			}
		})
	}
}
