package workers_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/rivertype"

	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/internal/fleettest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

// TestTickEnqueuesScansOfDuePartitions: Set.Tick, outside River's periodic
// job, does what a tick job does: it enqueues one scan for each partition
// holding a due row (not for a partition whose rows fall due later), and a
// second tick adds none while those scans wait. The fleet is not started, so
// nothing runs the scans.
func TestTickEnqueuesScansOfDuePartitions(t *testing.T) {
	t.Parallel()
	for _, tt := range deadlineRows {
		t.Run(tt.r.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.New(t)
			f, err := fleet.New(ctx, fleet.Config{DatabaseURL: db.URL, RiverSchema: testdb.RiverSchema,
				Reconcilers: fleettest.Fast(tt.r), Logger: fleettest.Logger(t)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(f.Close)

			now := store.NowMs()
			tt.insert(t, db.Pool, 3, now-1000)
			tt.insert(t, db.Pool, 7, now-5)
			tt.insert(t, db.Pool, 9, now+3_600_000)
			scanned := func() []int16 {
				t.Helper()
				rows, err := db.Pool.Query(ctx, `SELECT (args->>'partition')::smallint FROM river.river_job
					WHERE kind = $1 AND state = 'available' ORDER BY 1`, tt.scan(0).Kind())
				if err != nil {
					t.Fatal(err)
				}
				ps, err := pgx.CollectRows(rows, pgx.RowTo[int16])
				if err != nil {
					t.Fatal(err)
				}
				return ps
			}

			for i := range 2 {
				if err := f.Workers.Tick(ctx, f.Client, tt.r); err != nil {
					t.Fatalf("tick %d: %v", i+1, err)
				}
				if got := scanned(); !slices.Equal(got, []int16{3, 7}) {
					t.Fatalf("after tick %d: scans of partitions %v; want [3 7]", i+1, got)
				}
			}
			if c := f.Workers.Stats().For(tt.r.Name).Snapshot(); c.Ticks != 2 || c.Errors != 0 {
				t.Fatalf("stats %+v; want 2 ticks and no error", c)
			}

		})
	}
}

// TestTicksOfOneInstantShareAFetch: the ticks the leader inserts together
// (here its RunOnStart ticks) come to a process in one fetch, so an idle
// fleet pays one fetch per instant, not one per tick and one more after the
// last. All three carry the same attempted_at, the now() of the one fetch
// that took them; a tick queue of one worker (the regression) fetched them
// one by one, at three times.
func TestTicksOfOneInstantShareAFetch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	rs := []*workers.Reconciler{workers.LeaseExpiry, workers.SuspensionTimeout, workers.DelayedPromotion}
	intervals := map[string]time.Duration{}
	for _, r := range rs {
		intervals[r.Name] = time.Hour // only the RunOnStart ticks
	}
	f := fleettest.Start(t, db, fleet.Config{Reconcilers: intervals})
	fleettest.WaitFor(t, fleettest.Patient, "each reconciler's first tick", func() (bool, string) {
		for _, r := range rs {
			if n := f.Workers.Stats().For(r.Name).Ticks.Load(); n < 1 {
				return false, r.Name + " has not ticked"
			}
		}
		return true, ""
	})
	kinds := make([]string, len(rs))
	for i, r := range rs {
		kinds[i] = r.TickKind()
	}
	var ticks, fetches int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT attempted_at) FROM river.river_job WHERE kind = ANY($1)`,
		kinds).Scan(&ticks, &fetches); err != nil {
		t.Fatal(err)
	}
	if ticks != len(rs) || fetches != 1 {
		t.Fatalf("%d ticks taken by %d fetches; want %d ticks taken by one", ticks, fetches, len(rs))
	}
}

// TestTicksRunOneAtATimePerProcess: a tick started while another of its
// process runs waits for it (ticks lock every child of their tables; see
// Set.Middleware), at most the tick wait, then fails naming the wait; one
// whose context ends while it waits fails with that; once the running tick
// returns, the next starts. Row jobs never wait. A regression that let ticks
// run side by side calls the second tick's worker, which fails the test; one
// that waited without a bound blocks until the test's timeout.
func TestTicksRunOneAtATimePerProcess(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://nobody@127.0.0.1:1/none") // never dialled: the middleware runs no SQL
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	set, err := workers.New(workers.Config{Pool: pool, Logger: fleettest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	set.SetTickWait(50 * time.Millisecond)
	mw := set.Middleware()[0].(rivertype.WorkerMiddleware)
	tick := func(r *workers.Reconciler) *rivertype.JobRow {
		return &rivertype.JobRow{Kind: r.TickKind(), EncodedArgs: []byte(`{}`)}
	}
	mustNotRun := func(context.Context) error { t.Error("a tick ran beside another"); return nil }

	entered, release, firstDone := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		firstDone <- mw.Work(ctx, tick(workers.LeaseExpiry), func(context.Context) error {
			close(entered)
			<-release
			return nil
		})
	}()
	<-entered

	err = mw.Work(ctx, tick(workers.SuspensionTimeout), mustNotRun)
	if err == nil || !strings.Contains(err.Error(), "waited 50ms for the ticks ahead of it") {
		t.Fatalf("second tick: %v; want it to give up after the tick wait", err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := mw.Work(cancelled, tick(workers.DelayedPromotion), mustNotRun); !errors.Is(err, context.Canceled) {
		t.Fatalf("tick with its context ended: %v; want context.Canceled", err)
	}
	row := &rivertype.JobRow{Kind: workers.RowJobOf(workers.LeaseExpiry, 0, store.DueRow{}).Kind(), EncodedArgs: []byte(`{}`)}
	ran := false
	if err := mw.Work(ctx, row, func(context.Context) error { ran = true; return nil }); err != nil || !ran {
		t.Fatalf("row job beside a tick: ran %v, %v; want it run at once", ran, err)
	}

	close(release)
	if err := <-firstDone; err != nil {
		t.Fatal(err)
	}
	ran = false
	if err := mw.Work(ctx, tick(workers.SuspensionTimeout), func(context.Context) error { ran = true; return nil }); err != nil || !ran {
		t.Fatalf("tick after the first returned: ran %v, %v; want it run", ran, err)
	}
}

// TestScansOfBackToBackTicksStartWithoutAPoll: two ticks inserting scans
// one right after the other (as a process's ticks of one instant do) both
// get their scans started at once. River announces the first insert only
// (one notification per queue per fetch cooldown, here 2 s so that it
// surely holds the second back), and the scans' queue polls only every
// hour here (longer than its wait, fleettest.Patient): the second tick's
// scan starts because the fleet announces it (workers.Config.WakeScans).
// Without that, it waits for the poll and the test times out (1 of 2 scans
// completed).
func TestScansOfBackToBackTicksStartWithoutAPoll(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	f := fleettest.Start(t, db, fleet.Config{Reconcilers: noSweep(), RowFetchCooldown: 2 * time.Second, FetchPollInterval: time.Hour})
	first, second := deadlineRows[0], deadlineRows[1]
	first.insert(t, db.Pool, 5, store.NowMs()-1000)
	second.insert(t, db.Pool, 6, store.NowMs()-1000)
	for _, tt := range []deadlineRow{first, second} {
		if err := f.Workers.Tick(ctx, f.Client, tt.r); err != nil {
			t.Fatal(err)
		}
	}
	fleettest.WaitFor(t, fleettest.Patient, "both ticks' scans completed", func() (bool, string) {
		var done int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM river.river_job WHERE kind = ANY($1) AND state = 'completed'`,
			[]string{first.scan(0).Kind(), second.scan(0).Kind()}).Scan(&done); err != nil {
			t.Fatal(err)
		}
		return done == 2, fleettest.Statusf("%d of 2 scans completed", done)
	})
}

// TestRowJobsOfBackToBackScansStartWithoutAPoll: a scan committing row
// jobs already due soon after another scan's gets them started. River
// announces an insert at most once per queue per cooldown, here an hour
// (fleet.Config.InsertNotifyCooldown): the first scan's job is announced
// and fetched at once, the second's is not, and the rows' queue polls only
// every hour here. It starts because the scan announces it (the rows'
// waker, as for jobs enqueued ahead). Without that it waits for the poll
// and the test times out (the second row not acted on).
//
// The rows' fetch cooldown stays the default 20 ms: a fetch the first job
// set off (its own wake-up's) is over long before the second scan inserts,
// so nothing but the second wake-up fetches the second job.
func TestRowJobsOfBackToBackScansStartWithoutAPoll(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	f := fleettest.Start(t, db, fleet.Config{Reconcilers: noSweep(), InsertNotifyCooldown: time.Hour, FetchPollInterval: time.Hour})
	for i, tt := range []deadlineRow{deadlineRows[0], deadlineRows[1]} {
		p := int16(5 + i)
		id := tt.insert(t, db.Pool, p, store.NowMs()-1000)
		if err := f.Workers.Tick(ctx, f.Client, tt.r); err != nil {
			t.Fatal(err)
		}
		fleettest.WaitFor(t, fleettest.Patient, tt.r.Name+"'s row acted on", func() (bool, string) {
			return tt.acted(t, db.Pool, p, id), fleettest.Statusf("%+v", f.Workers.Stats().For(tt.r.Name).Snapshot())
		})
	}
}
