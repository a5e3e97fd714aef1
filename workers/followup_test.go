package workers_test

import (
	"context"
	"testing"

	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/internal/fleettest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
)

// TestStartedScanGetsAFollowUpWithoutItsRowLocked: a partition whose scan
// has started (here: running on no process, its river_job row locked by
// another transaction, as River's completer locks the rows it finalizes)
// still has its due rows found by the next tick, through a follow-up scan
// keyed by the started scan's id. The tick never offers the started scan's
// own key: River's unique insert would wait for that row lock (and, with
// the completer locking others in another order, deadlock), so without the
// follow-up no row here is ever acted on. The batch of 2 makes the
// follow-up continue itself for 5 rows; its continuations keep its key, or
// they too would wait on the lock.
//
// A partition whose scan waits in the queue (available, not yet fetched) is
// left alone: that scan will see what the tick saw.
func TestStartedScanGetsAFollowUpWithoutItsRowLocked(t *testing.T) {
	t.Parallel()
	for _, tt := range deadlineRows {
		t.Run(tt.r.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.New(t)
			client := insertOnlyClient(t, db.Pool)
			const started, waiting = int16(5), int16(6)
			scanJob := func(p int16, state string) int64 {
				res, err := client.Insert(ctx, tt.scan(p), nil)
				if err != nil {
					t.Fatal(err)
				}
				// Far in the future, so no fetch takes the available one.
				if _, err := db.Pool.Exec(ctx, `UPDATE river.river_job SET state = $2, attempt = 1, attempted_at = now(),
					scheduled_at = now() + interval '1 hour' WHERE id = $1`, res.Job.ID, state); err != nil {
					t.Fatal(err)
				}
				return res.Job.ID
			}
			startedID := scanJob(started, "running")
			scanJob(waiting, "available")

			lock, err := db.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer lock.Rollback(ctx) //nolint:errcheck // the test's end releases the lock
			if _, err := lock.Exec(ctx, `SELECT 1 FROM river.river_job WHERE id = $1 FOR UPDATE`, startedID); err != nil {
				t.Fatal(err)
			}

			var ids []string
			for range 5 {
				ids = append(ids, tt.insert(t, db.Pool, started, store.NowMs()-1000))
			}
			waitingRow := tt.insert(t, db.Pool, waiting, store.NowMs()-1000)

			f := fleettest.Start(t, db, fleet.Config{Reconcilers: fleettest.Fast(tt.r), BatchSize: 2})
			c := f.Workers.Stats().For(tt.r.Name)
			fleettest.WaitFor(t, fleettest.Patient, "every row of the partition with a started scan acted on", func() (bool, string) {
				n := 0
				for _, id := range ids {
					if tt.acted(t, db.Pool, started, id) {
						n++
					}
				}
				return n == len(ids), fleettest.Statusf("%d of %d acted on; %+v", n, len(ids), c.Snapshot())
			})
			var followUps, followUpsNotCompleted int
			if err := db.Pool.QueryRow(ctx, `
				SELECT count(*), count(*) FILTER (WHERE state <> 'completed') FROM river.river_job
				 WHERE kind = $1 AND (args->>'partition')::int = $2 AND (args->>'follows')::bigint = $3`,
				tt.scan(0).Kind(), started, startedID).Scan(&followUps, &followUpsNotCompleted); err != nil {
				t.Fatal(err)
			}
			// At least the follow-up and a continuation keeping its key. A
			// tick landing while a continuation runs gives that one a
			// follow-up of its own, which may take the last rows: both are
			// right, so the chain from job 1 is not always three long.
			if followUps < 2 {
				t.Fatalf("%d scans follow job %d; want a follow-up and its continuations", followUps, startedID)
			}
			if st := c.Snapshot(); st.FollowUpScans < 1 {
				t.Fatalf("stats %+v; want a follow-up scan", st)
			}
			// No job of the reconciler hit a deadlock. (A tick may time out on
			// a loaded machine, its first one planning over every partition on
			// a cold connection; had the ticks waited on the locked row, no
			// row above would have been acted on.)
			var deadlocked int
			if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM river.river_job WHERE kind = ANY($1) AND errors::text LIKE '%deadlock%'`,
				[]string{tt.r.TickKind(), tt.r.ScanKind(), tt.r.RowKind()}).Scan(&deadlocked); err != nil {
				t.Fatal(err)
			}
			if deadlocked != 0 {
				t.Fatalf("%d jobs failed on a deadlock; want none", deadlocked)
			}

			// The waiting scan's partition got nothing: no second scan, no
			// row job, its row untouched.
			var scans int
			if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM river.river_job WHERE kind = $1 AND (args->>'partition')::int = $2`,
				tt.scan(0).Kind(), waiting).Scan(&scans); err != nil {
				t.Fatal(err)
			}
			if scans != 1 || tt.acted(t, db.Pool, waiting, waitingRow) {
				t.Fatalf("partition %d: %d scans, row acted on %v; want its waiting scan alone and the row untouched",
					waiting, scans, tt.acted(t, db.Pool, waiting, waitingRow))
			}
		})
	}
}
