package workers_test

import (
	"context"
	"testing"
	"time"

	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/internal/fleettest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

// TestBusyPartitionRescansRowsNoScanEnqueued: a partition whose row jobs wait
// in the queue (busy) is skipped by ticks, but a due row that no scan
// enqueued (inserted after its partition was last scanned) would then wait
// until the queue drained. With the rows queue paused, the tick sees more
// due rows than unfinished jobs in the partition and scans it again, which
// enqueues the new row; once every due row has its job, later ticks skip the
// partition again instead of re-offering its rows. Without the rescan the
// second row never gets a job while the queue is paused.
func TestBusyPartitionRescansRowsNoScanEnqueued(t *testing.T) {
	t.Parallel()
	for _, tt := range deadlineRows {
		t.Run(tt.r.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.New(t)
			f, c := startBusy(t, db, tt.r, 500*time.Millisecond)
			queued := func() int {
				var n int
				if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM river.river_job WHERE kind = $1 AND state = 'available'`,
					tt.r.RowKind()).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}

			first := tt.insert(t, db.Pool, 5, store.NowMs()-1000)
			fleettest.WaitFor(t, fleettest.Patient, "the first row's job queued", func() (bool, string) {
				n := queued()
				return n == 1, fleettest.Statusf("%d row jobs; %+v", n, c.Snapshot())
			})
			late := tt.insert(t, db.Pool, 5, store.NowMs()-1000)
			// A scan counts its jobs after their insert commits: the job
			// can be seen before the counters (a loaded run failed on it).
			fleettest.WaitFor(t, fleettest.Patient, "the late row's job queued although its partition is busy", func() (bool, string) {
				n := queued()
				return n == 2 && c.Enqueued.Load() >= 2, fleettest.Statusf("%d row jobs; %+v", n, c.Snapshot())
			})
			st := c.Snapshot()
			if st.BusyRescans < 1 || st.Enqueued != 2 {
				t.Fatalf("stats %+v; want a busy rescan and 2 row jobs", st)
			}

			// Every due row has its job now: the partition is skipped again.
			// (A tick counts itself before it decides, so wait for the skips.)
			fleettest.WaitFor(t, fleettest.Patient, "two more ticks skipping the partition", func() (bool, string) {
				return c.PartitionsBusy.Load() >= st.PartitionsBusy+2, fleettest.Statusf("%+v", c.Snapshot())
			})
			if now := c.Snapshot(); now.BusyRescans != st.BusyRescans || now.Enqueued != st.Enqueued || now.AlreadyQueued != st.AlreadyQueued {
				t.Fatalf("stats %+v after %+v; want the partition skipped as busy, not rescanned", now, st)
			}

			if err := f.Client.QueueResume(ctx, jobs.QueueRows, nil); err != nil {
				t.Fatal(err)
			}
			fleettest.WaitFor(t, fleettest.Patient, "both rows acted on", func() (bool, string) {
				return tt.acted(t, db.Pool, 5, first) && tt.acted(t, db.Pool, 5, late), fleettest.Statusf("%+v", c.Snapshot())
			})
		})
	}
}

// TestBusyCancelPartitionIsSkipped: the cancel reconcilers have no due-row
// counts; a tick that finds one of their partitions busy (the rows queue
// paused, the group's dispatch job waiting: its flag is set, or the
// dispatcher would leave it alone) skips it without an error, as before
// busy rescans existed.
func TestBusyCancelPartitionIsSkipped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	f := fleettest.Start(t, db, fleet.Config{Reconcilers: fleettest.Fast(workers.CancelDispatch)})
	if err := f.Client.QueuePause(ctx, jobs.QueueRows, nil); err != nil {
		t.Fatal(err)
	}
	c := f.Workers.Stats().For(workers.CancelDispatch.Name)
	insertGroup(t, db.Pool, 9, 1, false, true, "")
	fleettest.WaitFor(t, fleettest.Patient, "two ticks skipping the busy partition", func() (bool, string) {
		return c.PartitionsBusy.Load() >= 2, fleettest.Statusf("%+v", c.Snapshot())
	})
	if st := c.Snapshot(); st.Errors != 0 || st.BusyRescans != 0 {
		t.Fatalf("stats %+v; want no error and no rescan", st)
	}
}
