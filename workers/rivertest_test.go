package workers_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertest"

	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

// TestRowJobsWorkedTwiceWithRivertest works the row job of every deadline
// reconciler with row args (deadlineRows) with rivertest, River's test
// worker (the job inserted and worked in a transaction, no fleet, no tick,
// no poll), twice on the same row: the first completes and applies the
// action; the second completes and changes nothing in the row's partition
// (every ff_* row there byte-identical: a row action is safe to run twice).
// Each case has a database of its own built by setup, as River's own tests
// do. A regression shows as a job that fails or is cancelled, an action not
// applied, or a second run that writes again (a re-check under lock lost).
// A deadlineRow with row args but no work fails here.
func TestRowJobsWorkedTwiceWithRivertest(t *testing.T) {
	t.Parallel()
	type testBundle struct {
		db   *testdb.DB
		logs func() string // the set's warnings and errors
		set  *workers.Set
	}
	setup := func(t *testing.T) *testBundle {
		t.Helper()
		logger, logs := captureLogger(t)
		b := &testBundle{db: testdb.New(t), logs: logs}
		var err error
		if b.set, err = workers.New(workers.Config{Pool: b.db.Pool, Logger: logger}); err != nil {
			t.Fatal(err)
		}
		return b
	}
	const p = 7
	for _, tt := range deadlineRows {
		if tt.rowJob == nil {
			continue // its row jobs carry no row of their own (promotions, backlogs, events: their own tests)
		}
		t.Run(tt.r.Name, func(t *testing.T) {
			t.Parallel()
			if tt.work == nil {
				t.Fatal("its deadlineRow has rowJob but no work (workAs of its row args)")
			}
			b := setup(t)
			deadline := store.NowMs() - 1000
			id := tt.insert(t, b.db.Pool, p, deadline)
			args := tt.rowJob(p, id, deadline)
			tables := ffTables(t, b.db.Pool)
			before := rowsNaming(t, b.db.Pool, tables, []int16{p}, []string{""})

			if kind := tt.work(t, b.set, tt.r, b.db.Pool, args); kind != river.EventKindJobCompleted {
				t.Fatalf("first run: job %s; want completed (logs: %s)", kind, b.logs())
			}
			if !tt.acted(t, b.db.Pool, p, id) {
				t.Fatalf("first run: the row's action was not applied (logs: %s)", b.logs())
			}
			once := rowsNaming(t, b.db.Pool, tables, []int16{p}, []string{""})
			if equalRows(once, before) {
				t.Fatal("first run changed no ff_* row of the partition")
			}

			if kind := tt.work(t, b.set, tt.r, b.db.Pool, args); kind != river.EventKindJobCompleted {
				t.Fatalf("second run: job %s; want completed (logs: %s)", kind, b.logs())
			}
			if twice := rowsNaming(t, b.db.Pool, tables, []int16{p}, []string{""}); !equalRows(twice, once) {
				t.Fatalf("second run changed the partition's rows:\nafter one run:  %v\nafter two runs: %v", once, twice)
			}
		})
	}
}

// workAs works args, a row job of r whose args type is R, once with
// rivertest, in a transaction of its own rolled back after (the action's
// writes go through the set's pool and commit): deadlineRow.work.
func workAs[R river.JobArgs](t *testing.T, set *workers.Set, r *workers.Reconciler, pool *pgxpool.Pool, args river.JobArgs) river.EventKind {
	t.Helper()
	typed, ok := args.(R)
	if !ok {
		t.Fatalf("%s: row args %T, where its deadlineRow's work takes %T", r.Name, args, typed)
	}
	ctx := context.Background()
	w := rivertest.NewWorker(t, riverpgxv5.New(nil), &river.Config{Schema: testdb.RiverSchema}, workers.RowWorker[R](set, r))
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	res, err := w.Work(ctx, t, tx, typed, nil)
	if err != nil {
		t.Fatalf("work %+v: %v", typed, err)
	}
	return res.EventKind
}
