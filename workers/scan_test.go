package workers_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/riverqueue/river"

	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/internal/fleettest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
)

// TestScanRetriesItsInsertAfterADeadlock: a scan's insert of row jobs takes
// the row lock of every row job still unfinished for one of its rows (River's
// unique insert, ON CONFLICT DO UPDATE), in the batch's order, so it can
// deadlock with a transaction locking those jobs in another order: River's
// completer, once in a 30-minute soak. Here a transaction holds the second
// row's job, waits until the scan holds the first and waits for the second,
// then asks for the first: Postgres aborts the scan's transaction (it waited
// first, so its deadlock check runs first). The scan must run its insert
// again at once and complete in its first attempt, inserting the third row's
// job, which is then acted on. A regression fails the scan job with
// "deadlock detected" (attempt 1 errored, Errors 1, the third row waiting
// for River's retry).
func TestScanRetriesItsInsertAfterADeadlock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tt := deadlineRows[0] // lease expiry
	db := testdb.New(t)
	f := fleettest.Start(t, db, fleet.Config{Reconcilers: noSweep()})
	c := f.Workers.Stats().For(tt.r.Name)

	const p = int16(9)
	now := store.NowMs()
	first := tt.insert(t, db.Pool, p, now-3000)
	second := tt.insert(t, db.Pool, p, now-2000)
	third := tt.insert(t, db.Pool, p, now-1000)
	// The first two rows' jobs wait an hour ahead, unfinished, so the scan's
	// insert conflicts with (and locks) them without River working them.
	rowJob := func(id string, deadlineMs int64) int64 {
		res, err := f.Client.Insert(ctx, tt.rowJob(p, id, deadlineMs), &river.InsertOpts{ScheduledAt: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		return res.Job.ID
	}
	firstJob, secondJob := rowJob(first, now-3000), rowJob(second, now-2000)

	lock, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(ctx) //nolint:errcheck // released below; a no-op then
	var lockPID int
	// The victim must be the scan: this transaction checks for a deadlock
	// long after the scan's own check (deadlock_timeout, 1 s) has run.
	if err := lock.QueryRow(ctx, `SELECT pg_backend_pid(), set_config('deadlock_timeout', '60s', true)`).Scan(&lockPID, new(string)); err != nil {
		t.Fatal(err)
	}
	if _, err := lock.Exec(ctx, `SELECT 1 FROM river.river_job WHERE id = $1 FOR UPDATE`, secondJob); err != nil {
		t.Fatal(err)
	}

	scan, err := f.Client.Insert(ctx, tt.scan(p), nil)
	if err != nil {
		t.Fatal(err)
	}
	// The scan's insert, blocked by lock (a backend of this test's database
	// waiting on a lock the test's transaction holds).
	fleettest.WaitFor(t, 3*time.Minute, "the scan's insert waiting for the second row's job", func() (bool, string) {
		var waiting bool
		if err := db.Pool.QueryRow(ctx, `
			SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			                WHERE datname = current_database() AND $1 = ANY (pg_blocking_pids(pid))
			                  AND query ILIKE '%INSERT INTO%river_job%')`,
			lockPID).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		return waiting, fleettest.Statusf("scan job %+v", readJob(t, db.Pool, scan.Job.ID))
	})
	// Blocks until Postgres aborts the scan's transaction, which held it.
	if _, err := lock.Exec(ctx, `SELECT 1 FROM river.river_job WHERE id = $1 FOR UPDATE`, firstJob); err != nil {
		t.Fatal(err)
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	j := waitJobState(t, db.Pool, scan.Job.ID, "completed")
	if j.Attempt != 1 || len(j.Errors) != 0 {
		t.Fatalf("scan job %+v; want completed in its first attempt", j)
	}
	fleettest.WaitFor(t, fleettest.Patient, "the third row acted on", func() (bool, string) {
		return tt.acted(t, db.Pool, p, third), fleettest.Statusf("%+v", c.Snapshot())
	})
	// One retry, or two: the retry runs at once, and may take the first
	// row's job again before this test's transaction (waiting for it) is
	// granted it, deadlocking a second time until that transaction ends.
	if st := c.Snapshot(); st.DeadlockRetries < 1 || st.Errors != 0 || st.Enqueued != 1 || st.AlreadyQueued != 2 {
		t.Fatalf("stats %+v; want a deadlock retry, no error, the third row's job enqueued and the other two already queued", st)
	}
	for _, id := range []int64{firstJob, secondJob} {
		if j := readJob(t, db.Pool, id); j.State != "scheduled" || strings.Join(j.Errors, "") != "" {
			t.Fatalf("row job %d: %+v; want it left scheduled", id, j)
		}
	}
}
