package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
)

// TestSetup: the benchmark's setup builds its template, opens a fresh copy of
// it with every table a run needs, reads the server's settings, and its
// cleanup drops both databases. A regression fails `make bench` or `make
// soak` at its start, found only by whoever next runs them (setup once read
// the settings from its database before creating it), or leaves databases
// behind on the server.
//
// Not parallel: its template's ~10,000 relations of DDL overflow the
// server's shared invalidation queue, and a backend left behind has its
// caches reset, which is what TestWarm counts; a package's serial tests run
// before its parallel ones.
func TestSetup(t *testing.T) {
	ctx := context.Background()
	name := fmt.Sprintf("ffr_bench_test_%d", os.Getpid())
	cfg := Defaults()
	cfg.DBName, cfg.AdminURL, cfg.Logger = name, testdb.AdminURL(), slog.New(slog.DiscardHandler)
	// Whatever happens below, nothing is left on the server.
	t.Cleanup(func() {
		_ = adminExec(context.Background(), cfg.AdminURL, dropDatabase(name), dropDatabase(name+"_tmpl"))
	})
	e, cleanup, err := setup(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if e.server.Version == "" || e.server.MaxConnections <= 0 {
		t.Errorf("server settings not read: %+v", e.server)
	}
	var tables int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_class
		WHERE relname IN ('river_job', 'ff_attempt', 'ff_exec_core', 'ffreconcile_worker', 'ffreconcile_outbox_trim') AND relkind IN ('r', 'p')`).
		Scan(&tables); err != nil || tables != 5 {
		t.Errorf("the bench database holds %d of the 5 tables checked (%v)", tables, err)
	}
	checkStages(t, e)
	if err := e.reset(ctx); err != nil {
		t.Fatalf("reset: %v", err)
	}
	cleanup()
	admin, err := pgx.Connect(ctx, cfg.AdminURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	var left int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname IN ($1::text, $1::text || '_tmpl')`, name).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d bench databases left after cleanup (%v)", left, err)
	}
}

// checkStages: the lateness section's stage from a row's deadline to its
// job's insert reads the deadline the stream gave the row's execution
// (raw_fields.bench_deadline_ms) for a row job carrying none (a row
// already due), and a schedule given at insert for one without an
// execution the stream seeded. A regression shows as the stage missing the
// rows already due (counted 1 job instead of 2) or a wrong deadline.
func checkStages(t *testing.T, e *env) {
	t.Helper()
	ctx := context.Background()
	const created = 1_767_000_010_000 // Unix ms
	id := fftest.InsertExec(t, e.pool, fftest.Exec{Partition: 7,
		RawFields: map[string]any{"bench_deadline_ms": created - 3000}})
	// One job of the stream's execution, one of a row it did not seed,
	// scheduled at insert 2 s ahead of its start.
	if _, err := e.pool.Exec(ctx, `
		INSERT INTO river.river_job (args, kind, max_attempts, queue, state, created_at, scheduled_at, attempted_at, finalized_at)
		SELECT jsonb_build_object('partition', 7, 'execution_id', x.id), 'ff.lease_expiry.release', 25, 'ff_rows',
		       'completed'::river.river_job_state, to_timestamp($1 / 1000.0), to_timestamp(x.at / 1000.0),
		       to_timestamp(x.at / 1000.0), to_timestamp(x.at / 1000.0)
		  FROM (VALUES ($2::uuid, $1::bigint), (gen_random_uuid(), $1::bigint + 2001)) x(id, at)`, created, id); err != nil {
		t.Fatal(err)
	}
	stages, err := e.stages(ctx, "lease_expiry")
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range stages {
		if st.Step != "deadline → enqueued" {
			continue
		}
		// One job 3 s after its row's deadline, one 2 s before the
		// deadline its schedule carries: p50 interpolates to 0.5 s.
		if st.Jobs != 2 || st.P50.Round(time.Millisecond) != 500*time.Millisecond {
			t.Fatalf("deadline → enqueued over %d jobs, p50 %s; want 2 jobs, p50 500ms", st.Jobs, st.P50)
		}
		return
	}
	t.Fatalf("no deadline → enqueued stage in %+v", stages)
}
