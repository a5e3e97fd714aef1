package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"

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
