package migrations_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
	_ "time/tzdata" // the table's time zones, whatever the machine has

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/migrations"
)

// promoteRow is what a promotion job is made of, as river_job stores it.
type promoteRow struct {
	ID           int64
	Kind, Queue  string
	Args         string // jsonb's text
	MaxAttempts  int
	Priority     int
	Tags         []string
	Metadata     string
	State        string
	UniqueKey    []byte
	UniqueStates string // bit(8)
	ScheduledAt  time.Time
	CreatedAt    time.Time
}

func readPromoteRow(t *testing.T, ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, id int64) promoteRow {
	t.Helper()
	var r promoteRow
	err := q.QueryRow(ctx, `
		SELECT id, kind, queue, args::text, max_attempts, priority, tags, metadata::text, state::text,
		       unique_key, unique_states::text, scheduled_at, created_at
		  FROM river.river_job WHERE id = $1`, id).Scan(&r.ID, &r.Kind, &r.Queue, &r.Args, &r.MaxAttempts, &r.Priority,
		&r.Tags, &r.Metadata, &r.State, &r.UniqueKey, &r.UniqueStates, &r.ScheduledAt, &r.CreatedAt)
	if err != nil {
		t.Fatalf("read job %d: %v", id, err)
	}
	return r
}

// promoteSQL calls the function in tx, with at given as text in the
// session's own time zone (as a psql user types it), or NULL.
func promoteSQL(ctx context.Context, tx pgx.Tx, partition int16, id string, at *time.Time, loc *time.Location) (jobID int64, dup bool, err error) {
	var atText *string
	if at != nil {
		s := at.In(loc).Format("2006-01-02 15:04:05.999999")
		atText = &s
	}
	err = tx.QueryRow(ctx, `SELECT job_id, duplicate FROM river.ffreconcile_promote($1::smallint, $2::uuid, $3::text::timestamptz)`,
		partition, id, atText).Scan(&jobID, &dup)
	return jobID, dup, err
}

func insertOnly(t *testing.T, pool *pgxpool.Pool) *river.Client[pgx.Tx] {
	t.Helper()
	c, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Schema: testdb.RiverSchema})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestPromoteFunctionWritesWhatTheGoClientWrites: for each args, the row
// the SQL function inserts equals the one River's Go client inserts for the
// same jobs.PromoteArgs, field by field: kind, queue, args, attempts,
// priority, tags, metadata, state, unique_key, unique_states and
// scheduled_at (one scheduler interval before a far enough at, else the
// insert's now()). The function is called in sessions of several time
// zones with at typed in that zone, the Go client given at in that zone
// too. A regression (a fraction formatted otherwise, a key field out of
// order, a zone leaking into "at") shows as a differing unique key: the
// two would never dedupe.
func TestPromoteFunctionWritesWhatTheGoClientWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	client := insertOnly(t, db.Pool)

	now := time.Now().UTC()
	hour := now.Add(time.Hour).Truncate(time.Second)
	at := func(t time.Time) *time.Time { return &t }
	tests := []struct {
		name      string
		partition int16
		at        *time.Time
		zone      string
		upperUUID bool // the Go caller spells the UUID in upper case
		wantState string
	}{
		{"NoAt", 7, nil, "UTC", false, "available"},
		{"NoAtPartition0", 0, nil, "Asia/Kolkata", false, "available"},
		{"NoAtPartition255", 255, nil, "America/St_Johns", true, "available"},
		{"WholeSecond", 7, at(hour), "America/St_Johns", false, "scheduled"},
		{"Fraction", 0, at(hour.Add(123456 * time.Microsecond)), "Asia/Kolkata", false, "scheduled"},
		{"FractionTrailingZeros", 255, at(hour.Add(100 * time.Millisecond)), "Pacific/Chatham", false, "scheduled"},
		{"OneMicrosecond", 7, at(hour.Add(time.Microsecond)), "UTC", false, "scheduled"},
		{"Milliseconds", 7, at(hour.Add(250 * time.Millisecond)), "Europe/Paris", true, "scheduled"},
		{"WithinTheSchedulerInterval", 7, at(now.Add(2 * time.Second).Truncate(time.Millisecond)), "Europe/Paris", false, "available"},
		{"Past", 7, at(now.Add(-time.Hour).Truncate(time.Second).Add(500 * time.Millisecond)), "America/Los_Angeles", false, "available"},
		{"LastMicrosecondOfYear9999", 7, at(time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC)), "UTC", false, "scheduled"},
		{"Year999", 7, at(time.Date(999, 6, 1, 0, 0, 0, 500000000, time.UTC)), "UTC", false, "available"},
		{"Year1", 7, at(jobs.PromoteAtMin), "UTC", false, "available"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			loc, err := time.LoadLocation(tt.zone)
			if err != nil {
				t.Fatal(err)
			}
			id := uuid.NewString()
			goID := id
			if tt.upperUUID {
				goID = strings.ToUpper(id)
			}
			args := jobs.PromoteArgs{Partition: &tt.partition, ExecutionID: goID}
			if tt.at != nil {
				a := tt.at.In(loc)
				args.At = &a
			}

			var goRow, sqlRow promoteRow
			// Each in a transaction rolled back: the two share a unique key.
			err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				res, err := client.InsertTx(ctx, tx, args, nil)
				if err != nil {
					return err
				}
				goRow = readPromoteRow(t, ctx, tx, res.Job.ID)
				return errRollback
			})
			if !errors.Is(err, errRollback) {
				t.Fatalf("Go insert: %v", err)
			}
			err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, "SELECT set_config('TimeZone', $1, true)", tt.zone); err != nil {
					return err
				}
				jobID, dup, err := promoteSQL(ctx, tx, tt.partition, id, tt.at, loc)
				if err != nil {
					return err
				}
				if dup {
					t.Errorf("first SQL insert reported a duplicate")
				}
				sqlRow = readPromoteRow(t, ctx, tx, jobID)
				return errRollback
			})
			if !errors.Is(err, errRollback) {
				t.Fatalf("SQL insert: %v", err)
			}

			if !bytes.Equal(sqlRow.UniqueKey, goRow.UniqueKey) || len(goRow.UniqueKey) != 32 {
				t.Errorf("unique_key\n sql %x\n go  %x", sqlRow.UniqueKey, goRow.UniqueKey)
			}
			for _, f := range []struct{ name, sql, goes string }{
				{"args", sqlRow.Args, goRow.Args},
				{"kind", sqlRow.Kind, goRow.Kind},
				{"queue", sqlRow.Queue, goRow.Queue},
				{"metadata", sqlRow.Metadata, goRow.Metadata},
				{"state", sqlRow.State, goRow.State},
				{"unique_states", sqlRow.UniqueStates, goRow.UniqueStates},
				{"tags", strings.Join(sqlRow.Tags, ","), strings.Join(goRow.Tags, ",")},
			} {
				if f.sql != f.goes {
					t.Errorf("%s: sql %q, go %q", f.name, f.sql, f.goes)
				}
			}
			if sqlRow.MaxAttempts != goRow.MaxAttempts || sqlRow.Priority != goRow.Priority {
				t.Errorf("max_attempts/priority: sql %d/%d, go %d/%d", sqlRow.MaxAttempts, sqlRow.Priority, goRow.MaxAttempts, goRow.Priority)
			}
			if goRow.State != tt.wantState {
				t.Errorf("Go client's state %s; want %s (fix the table)", goRow.State, tt.wantState)
			}
			switch goRow.State {
			case "scheduled":
				if want := tt.at.Add(-jobs.RiverSchedulerInterval); !sqlRow.ScheduledAt.Equal(want) || !goRow.ScheduledAt.Equal(want) {
					t.Errorf("scheduled_at: sql %s, go %s; want %s", sqlRow.ScheduledAt, goRow.ScheduledAt, want)
				}
			default: // the insert's now()
				if !sqlRow.ScheduledAt.Equal(sqlRow.CreatedAt) || !goRow.ScheduledAt.Equal(goRow.CreatedAt) {
					t.Errorf("scheduled_at of an available job: sql %s (created %s), go %s (created %s); want its created_at",
						sqlRow.ScheduledAt, sqlRow.CreatedAt, goRow.ScheduledAt, goRow.CreatedAt)
				}
			}
			t.Logf("args %s", sqlRow.Args)
		})
	}
}

var errRollback = errors.New("roll back")

// TestPromoteFunctionDedupesWithGoClients: an unfinished promotion queued by
// either the SQL function or a Go client makes the other's identical insert
// a duplicate returning the queued job's id, in both orders; a call while
// an identical one's transaction is open waits for its outcome; once the job
// finished, the key is free again. A regression inserts a second job, which
// the fleet would run twice.
func TestPromoteFunctionDedupesWithGoClients(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	client := insertOnly(t, db.Pool)
	at := time.Now().Add(time.Hour).Truncate(time.Millisecond).Add(7 * time.Microsecond)
	p := int16(42)

	sqlCommitted := func(t *testing.T, id string, at *time.Time) (int64, bool) {
		t.Helper()
		var jobID int64
		var dup bool
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			var err error
			jobID, dup, err = promoteSQL(ctx, tx, p, id, at, time.UTC)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return jobID, dup
	}

	t.Run("SQLThenGo", func(t *testing.T) {
		id := uuid.NewString()
		first, dup := sqlCommitted(t, id, &at)
		if dup {
			t.Fatal("first insert reported a duplicate")
		}
		res, err := client.Insert(ctx, jobs.PromoteArgs{Partition: &p, ExecutionID: id, At: &at}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !res.UniqueSkippedAsDuplicate || res.Job.ID != first {
			t.Fatalf("Go insert after SQL: job %d, duplicate %v; want job %d, duplicate", res.Job.ID, res.UniqueSkippedAsDuplicate, first)
		}
		// And another SQL call.
		if again, dup := sqlCommitted(t, id, &at); !dup || again != first {
			t.Fatalf("second SQL insert: job %d, duplicate %v; want job %d, duplicate", again, dup, first)
		}
	})
	t.Run("GoThenSQL", func(t *testing.T) {
		for _, at := range []*time.Time{nil, &at} {
			id := uuid.NewString()
			res, err := client.Insert(ctx, jobs.PromoteArgs{Partition: &p, ExecutionID: id, At: at}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got, dup := sqlCommitted(t, id, at); !dup || got != res.Job.ID {
				t.Fatalf("SQL insert after Go (at %v): job %d, duplicate %v; want job %d, duplicate", at, got, dup, res.Job.ID)
			}
		}
	})
	t.Run("ConcurrentCallersWaitForTheFirst", func(t *testing.T) {
		// A second call while the first's transaction is open waits on
		// River's unique index: a duplicate of the first once it commits, a
		// new job if it rolls back.
		for _, commit := range []bool{true, false} {
			id := uuid.NewString()
			txA, err := db.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			first, _, err := promoteSQL(ctx, txA, p, id, nil, time.UTC)
			if err != nil {
				t.Fatal(err)
			}
			type result struct {
				id  int64
				dup bool
				err error
			}
			done := make(chan result, 1)
			go func() {
				var r result
				r.err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
					var err error
					r.id, r.dup, err = promoteSQL(ctx, tx, p, id, nil, time.UTC)
					return err
				})
				done <- r
			}()
			// The second call is waiting for txA's row lock before txA ends.
			waitUntil(t, func() bool {
				var waiting bool
				_ = db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database()
					AND wait_event_type = 'Lock' AND query LIKE '%ffreconcile_promote%')`).Scan(&waiting)
				return waiting
			})
			if commit {
				err = txA.Commit(ctx)
			} else {
				err = txA.Rollback(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			r := <-done
			switch {
			case r.err != nil:
				t.Fatal(r.err)
			case commit && (!r.dup || r.id != first):
				t.Fatalf("after the first committed: job %d, duplicate %v; want job %d, duplicate", r.id, r.dup, first)
			case !commit && (r.dup || r.id == first):
				t.Fatalf("after the first rolled back: job %d, duplicate %v; want a new job", r.id, r.dup)
			}
		}
	})
	t.Run("FinishedFreesTheKey", func(t *testing.T) {
		id := uuid.NewString()
		first, _ := sqlCommitted(t, id, nil)
		if _, err := db.Pool.Exec(ctx, `UPDATE river.river_job SET state = 'completed', finalized_at = now() WHERE id = $1`, first); err != nil {
			t.Fatal(err)
		}
		if second, dup := sqlCommitted(t, id, nil); dup || second == first {
			t.Fatalf("insert after the first completed: job %d, duplicate %v; want a new job", second, dup)
		}
	})
	t.Run("OtherArgsAreOtherJobs", func(t *testing.T) {
		id := uuid.NewString()
		a, _ := sqlCommitted(t, id, nil)
		b, dupB := sqlCommitted(t, id, &at)
		later := at.Add(time.Microsecond)
		c, dupC := sqlCommitted(t, id, &later)
		if dupB || dupC || a == b || b == c {
			t.Fatalf("jobs %d, %d (dup %v), %d (dup %v); want three", a, b, dupB, c, dupC)
		}
	})
}

// TestPromoteFunctionInTheCallersTransaction: a promotion whose transaction
// rolls back never existed (no row, no notification); a committed one that
// is available at once wakes River's producers as a Go client's insert does
// (a notification on "river.river_insert" with {"queue": "ff_rows"}, sent at
// commit), and a scheduled one sends none, as Go's does not. Transactions
// calling at once send one between them. A notification sentinel sent
// afterwards orders each check without waiting.
func TestPromoteFunctionInTheCallersTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	listener, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Release()
	if _, err := listener.Exec(ctx, `LISTEN "river.river_insert"`); err != nil {
		t.Fatal(err)
	}
	next := func(t *testing.T) string {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		n, err := listener.Conn().WaitForNotification(wctx)
		if err != nil {
			t.Fatalf("no notification: %v", err)
		}
		return n.Payload
	}
	sentinel := func(t *testing.T, payload string) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, `SELECT pg_notify('river.river_insert', $1)`, payload); err != nil {
			t.Fatal(err)
		}
	}
	p := int16(3)

	rolledBack := uuid.NewString()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	jobID, _, err := promoteSQL(ctx, tx, p, rolledBack, nil, time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM river.river_job WHERE id = $1 OR args->>'execution_id' = $2`, jobID, rolledBack).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d rows of a rolled-back promotion", n)
	}
	sentinel(t, "after-rollback")
	if got := next(t); got != "after-rollback" {
		t.Fatalf("notification %q from a rolled-back promotion", got)
	}

	tx, err = db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := promoteSQL(ctx, tx, p, uuid.NewString(), nil, time.UTC); err != nil {
		t.Fatal(err)
	}
	sentinel(t, "before-commit") // outside tx: delivered first
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := next(t); got != "before-commit" {
		t.Fatalf("notification %q before the promotion's commit; want the sentinel", got)
	}
	if got := next(t); got != `{"queue": "ff_rows"}` {
		t.Fatalf("insert notification %q; want River's {\"queue\": \"ff_rows\"}", got)
	}

	// Transactions calling at once send one notification between them, not
	// one each: a NOTIFY serialises commits database-wide.
	txA, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer txA.Rollback(ctx) //nolint:errcheck
	txB, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer txB.Rollback(ctx) //nolint:errcheck
	for _, tx := range []pgx.Tx{txA, txB} {
		if _, _, err := promoteSQL(ctx, tx, p, uuid.NewString(), nil, time.UTC); err != nil {
			t.Fatal(err)
		}
	}
	for _, tx := range []pgx.Tx{txB, txA} {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	sentinel(t, "after-concurrent")
	if got := next(t); got != `{"queue": "ff_rows"}` {
		t.Fatalf("notification %q after two concurrent promotions; want one insert notification", got)
	}
	if got := next(t); got != "after-concurrent" {
		t.Fatalf("notification %q; want the sentinel after a single insert notification", got)
	}

	later := time.Now().Add(time.Hour)
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, _, err := promoteSQL(ctx, tx, p, uuid.NewString(), &later, time.UTC)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	sentinel(t, "after-scheduled")
	if got := next(t); got != "after-scheduled" {
		t.Fatalf("notification %q for a scheduled promotion; want none", got)
	}
}

// TestPromoteFunctionRefusesBadArgs: bad arguments raise an error naming
// the argument, with a SQLSTATE a caller can match, and insert nothing. A
// regression inserts a job the fleet cancels later, or one at a time no Go
// client could have written.
func TestPromoteFunctionRefusesBadArgs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	id := uuid.NewString()
	tests := []struct {
		name, call string
		args       []any
		code, want string
	}{
		{"PartitionNegative", `($1::smallint, $2::uuid)`, []any{-1, id}, "22023", "ffreconcile_promote: partition -1 is out of range 0..255"},
		{"Partition256", `($1::smallint, $2::uuid)`, []any{256, id}, "22023", "ffreconcile_promote: partition 256 is out of range 0..255"},
		{"PartitionNull", `(NULL::smallint, $1::uuid)`, []any{id}, "22004", "ffreconcile_promote: partition must not be NULL"},
		{"ExecutionIDNull", `(7::smallint, NULL::uuid)`, nil, "22004", "ffreconcile_promote: execution_id must not be NULL"},
		{"AtInfinity", `(7::smallint, $1::uuid, 'infinity')`, []any{id}, "22023", "ffreconcile_promote: at infinity is outside years 0001..9999 (UTC)"},
		{"AtMinusInfinity", `(7::smallint, $1::uuid, '-infinity')`, []any{id}, "22023", "ffreconcile_promote: at -infinity is outside years 0001..9999 (UTC)"},
		{"AtYear10000", `(7::smallint, $1::uuid, '10000-01-01 00:00:00+00')`, []any{id}, "22023", "is outside years 0001..9999 (UTC)"},
		{"AtMillisecondsAsSeconds", `(7::smallint, $1::uuid, to_timestamp(1777000000000))`, []any{id}, "22023", "is outside years 0001..9999 (UTC)"},
		{"AtBeforeYear1", `(7::smallint, $1::uuid, '0001-12-31 23:59:59+00 BC')`, []any{id}, "22023", "is outside years 0001..9999 (UTC)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := db.Pool.Exec(ctx, `SELECT * FROM river.ffreconcile_promote`+tt.call, tt.args...)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != tt.code || !strings.Contains(pgErr.Message, tt.want) {
				t.Fatalf("error %v; want SQLSTATE %s with %q", err, tt.code, tt.want)
			}
		})
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM river.river_job`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d jobs inserted by refused calls", n)
	}
}

// TestApplyPromoteFunctionReplacesOlderKeepsNewer: `worker migrate` installs
// the function where it is missing and replaces an older version in place
// (its body included); a newer one, from a later build, stays, so an older
// migrate never downgrades what newer fleets need. CheckPromoteFunction
// refuses a missing or older function with the fix and accepts the rest.
// Concurrent applies all succeed.
func TestApplyPromoteFunctionReplacesOlderKeepsNewer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.NewEmpty(t)
	const schema = "river_pf"
	if _, err := migrations.ApplyRiver(ctx, db.Pool, schema, nil); err != nil {
		t.Fatal(err)
	}
	check := func() error { return migrations.CheckPromoteFunction(ctx, db.Pool, schema) }
	if err := check(); err == nil || !strings.Contains(err.Error(), "river_pf.ffreconcile_promote is missing; run `worker migrate` (with --river-schema river_pf)") {
		t.Fatalf("check of a missing function: %v", err)
	}

	results := make([]migrations.PromoteFunctionResult, 4)
	errs := make([]error, len(results))
	var wg sync.WaitGroup
	for i := range results {
		wg.Go(func() { results[i], errs[i] = migrations.ApplyPromoteFunction(ctx, db.Pool, schema) })
	}
	wg.Wait()
	installed := 0
	for i, err := range errs {
		if err != nil {
			t.Fatalf("concurrent apply %d: %v", i, err)
		}
		if !results[i].Found {
			installed++
		}
	}
	if installed != 1 {
		t.Fatalf("%d of the concurrent applies found no function; want exactly the first", installed)
	}
	if err := check(); err != nil {
		t.Fatalf("check after apply: %v", err)
	}

	// An older version: another body, an older comment.
	if _, err := db.Pool.Exec(ctx, `
		CREATE OR REPLACE FUNCTION river_pf.ffreconcile_promote(partition smallint, execution_id uuid, at timestamptz DEFAULT NULL)
		RETURNS TABLE (job_id bigint, duplicate boolean) LANGUAGE sql AS $$ SELECT -1::bigint, false $$;
		COMMENT ON FUNCTION river_pf.ffreconcile_promote(smallint, uuid, timestamptz) IS 'ffreconcile_promote version 0: old'`); err != nil {
		t.Fatal(err)
	}
	if err := check(); err == nil || !strings.Contains(err.Error(), "is version 0, older than this worker's 1; run `worker migrate`") {
		t.Fatalf("check of an older function: %v", err)
	}
	res, err := migrations.ApplyPromoteFunction(ctx, db.Pool, schema)
	if err != nil || !res.Found || res.Previous != 0 || res.Installed != migrations.PromoteFunctionVersion {
		t.Fatalf("apply over an older version: %+v, %v", res, err)
	}
	var jobID int64
	if err := db.Pool.QueryRow(ctx, `SELECT job_id FROM river_pf.ffreconcile_promote(1::smallint, gen_random_uuid())`).Scan(&jobID); err != nil || jobID < 1 {
		t.Fatalf("replaced function returned job %d, %v; want a real job", jobID, err)
	}

	// A newer version stays.
	if _, err := db.Pool.Exec(ctx, `COMMENT ON FUNCTION river_pf.ffreconcile_promote(smallint, uuid, timestamptz) IS 'ffreconcile_promote version 99: newer'`); err != nil {
		t.Fatal(err)
	}
	res, err = migrations.ApplyPromoteFunction(ctx, db.Pool, schema)
	if err != nil || res.Previous != 99 || res.Installed != 99 {
		t.Fatalf("apply over a newer version: %+v, %v; want it left at 99", res, err)
	}
	var comment string
	if err := db.Pool.QueryRow(ctx, `SELECT obj_description('river_pf.ffreconcile_promote(smallint, uuid, timestamptz)'::regprocedure, 'pg_proc')`).Scan(&comment); err != nil || !strings.HasPrefix(comment, "ffreconcile_promote version 99") {
		t.Fatalf("comment %q, %v; want the newer version's", comment, err)
	}
	if err := check(); err != nil {
		t.Fatalf("check of a newer function: %v", err)
	}
}

// waitUntil polls cond every 10 ms for up to 20 s.
func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting for the condition")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
