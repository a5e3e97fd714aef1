package fleet_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/internal/testlog"
	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

// newFleet builds a fleet of cfg on db (not started); it is stopped and
// closed when t ends.
func newFleet(t *testing.T, db *testdb.DB, cfg fleet.Config) *fleet.Fleet {
	t.Helper()
	cfg.DatabaseURL, cfg.RiverSchema = db.URL, testdb.RiverSchema
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	f, err := fleet.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		_ = f.Stop(ctx)
		f.Close()
	})
	return f
}

func only(rs ...*workers.Reconciler) map[string]time.Duration {
	m := map[string]time.Duration{}
	for _, r := range rs {
		m[r.Name] = r.Interval
	}
	return m
}

// TestStartRefusesAnotherConfiguration: a process configured otherwise than
// a live process of its River schema does not start (nor records itself),
// one configured alike does, and once the others have stopped, so does
// the first. A regression starts both, and River's leader then ticks only
// its own reconcilers: the other's rows wait forever.
func TestStartRefusesAnotherConfiguration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	leases := newFleet(t, db, fleet.Config{Reconcilers: only(workers.LeaseExpiry)})
	if err := leases.Start(ctx); err != nil {
		t.Fatal(err)
	}
	promotions := newFleet(t, db, fleet.Config{Reconcilers: only(workers.DelayedPromotion)})
	err := promotions.Start(ctx)
	var mismatch *fleet.ConfigMismatchError
	if !errors.As(err, &mismatch) || mismatch.Other.ClientID != leases.Client.ID() ||
		mismatch.Diff != "reconcilers delayed_promotion here, lease_expiry there" {
		t.Fatalf("start of another configuration: %v; want a mismatch with %s naming the reconcilers", err, leases.Client.ID())
	}
	for _, want := range []string{"--river-schema", "docs/deployment.md", `River schema "river"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if n := fftest.Count(t, db.Pool, `SELECT count(*) FROM river.ffreconcile_worker`); n != 1 {
		t.Fatalf("%d heartbeat rows; want only the running process's", n)
	}

	alike := newFleet(t, db, fleet.Config{Reconcilers: only(workers.LeaseExpiry)})
	if err := alike.Start(ctx); err != nil {
		t.Fatalf("start of the same configuration: %v", err)
	}
	for _, f := range []*fleet.Fleet{leases, alike} {
		if err := f.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := promotions.Start(ctx); err != nil {
		t.Fatalf("start once the others stopped: %v", err)
	}
}

// TestConcurrentStartsOfTwoConfigurations: processes of two configurations
// starting at once in an empty schema: every one of one configuration
// starts, none of the other. Registrations are serialised, so a regression
// (a check and an insert that can interleave) starts both kinds.
func TestConcurrentStartsOfTwoConfigurations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	const each = 3
	var fleets []*fleet.Fleet
	for i := range 2 * each {
		r := workers.LeaseExpiry
		if i%2 == 1 {
			r = workers.SuspensionTimeout
		}
		fleets = append(fleets, newFleet(t, db, fleet.Config{Reconcilers: only(r)}))
	}
	errs := make([]error, len(fleets))
	var wg sync.WaitGroup
	for i, f := range fleets {
		wg.Go(func() { errs[i] = f.Start(ctx) })
	}
	wg.Wait()
	started := map[int]int{}
	for i, err := range errs {
		var mismatch *fleet.ConfigMismatchError
		switch {
		case err == nil:
			started[i%2]++
		case !errors.As(err, &mismatch):
			t.Fatalf("start %d: %v", i, err)
		}
	}
	if len(started) != 1 || (started[0] != each && started[1] != each) {
		t.Fatalf("started %v (configuration → processes); want all %d of one configuration and none of the other", started, each)
	}
}

// TestStartAcceptsAnEarlierVersion: a live process that records no
// configuration (a version before this check, mid rolling upgrade) does not
// block a start, which warns about it.
func TestStartAcceptsAnEarlierVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	if _, err := store.UpsertWorkerHeartbeat(ctx, db.Pool, testdb.RiverSchema,
		store.WorkerHeartbeat{ClientID: "old-version", Hostname: "h", PID: 1}); err != nil {
		t.Fatal(err)
	}
	var logs testlog.Buffer
	f := newFleet(t, db, fleet.Config{Reconcilers: only(workers.LeaseExpiry),
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err := f.Start(ctx); err != nil {
		t.Fatalf("start next to an earlier version: %v", err)
	}
	if !strings.Contains(logs.String(), "does not record its configuration") || !strings.Contains(logs.String(), "old-version") {
		t.Fatalf("no warning naming the earlier version's process:\n%s", logs.String())
	}
}

// TestStartNeedsAMigratedHeartbeatTable: without the config column (a
// heartbeat table of an earlier version) a start fails saying to run
// `worker migrate`, which adds it.
func TestStartNeedsAMigratedHeartbeatTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	if _, err := db.Pool.Exec(ctx, `ALTER TABLE river.ffreconcile_worker DROP COLUMN config`); err != nil {
		t.Fatal(err)
	}
	f := newFleet(t, db, fleet.Config{Reconcilers: only(workers.LeaseExpiry)})
	if err := f.Start(ctx); err == nil || !strings.Contains(err.Error(), "run `worker migrate`") {
		t.Fatalf("start on an outdated heartbeat table: %v; want it to say to run worker migrate", err)
	}
}

// TestNewNeedsTheCurrentPromoteFunction: a fleet does not start when the
// promote function other services call is missing from River's schema, or
// older than this build's, and says to run `worker migrate`. A regression
// starts a fleet while other services' promotions fail (no function) or are
// inserted unlike the Go clients' (an old one: never deduplicated).
func TestNewNeedsTheCurrentPromoteFunction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tests := []struct {
		name, ddl, want string
	}{
		{"Missing", `DROP FUNCTION river.ffreconcile_promote`,
			"the promote function river.ffreconcile_promote is missing; run `worker migrate` (with --river-schema river)"},
		{"Older", `COMMENT ON FUNCTION river.ffreconcile_promote IS 'ffreconcile_promote version 0: old'`,
			"the promote function river.ffreconcile_promote is version 0, older than this worker's 1; run `worker migrate` (with --river-schema river)"},
		{"Unversioned", `COMMENT ON FUNCTION river.ffreconcile_promote IS NULL`,
			"is version 0, older than this worker's 1; run `worker migrate`"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			if _, err := db.Pool.Exec(ctx, tt.ddl); err != nil {
				t.Fatal(err)
			}
			f, err := fleet.New(ctx, fleet.Config{DatabaseURL: db.URL, RiverSchema: testdb.RiverSchema,
				Reconcilers: only(workers.LeaseExpiry), Logger: slog.New(slog.DiscardHandler)})
			if err == nil {
				f.Close()
				t.Fatal("fleet built")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q; want it to contain %q", err, tt.want)
			}
		})
	}
}

// TestPollOnlyRefusesPrimaryDispatch: a fleet polling instead of
// listening (PollOnly, `--poll-only`) is refused when dependency is the
// primary dispatcher (its stale threshold off), naming both flags, and
// built with the default threshold, which needs no notification. A
// regression builds the first fleet, whose completion events then wait for
// the 15 s tick, silently, against what its settings asked for.
func TestPollOnlyRefusesPrimaryDispatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	cfg := fleet.Config{Reconcilers: only(workers.Dependency), PollOnly: true,
		DatabaseURL: db.URL, RiverSchema: testdb.RiverSchema, Logger: slog.New(slog.DiscardHandler)}

	primary := cfg
	primary.Settings = workers.Values{workers.DependencyStaleThreshold: workers.Off}
	f, err := fleet.New(ctx, primary)
	if err == nil {
		f.Close()
		t.Fatal("New: a polling fleet with primary dispatch was built; want it refused")
	}
	var ce *fleet.ConfigError
	if !errors.As(err, &ce) || ce.Flag != "poll-only" || !strings.Contains(err.Error(), "--dependency-stale-threshold") {
		t.Fatalf("New: %v; want a ConfigError of --poll-only naming --dependency-stale-threshold", err)
	}

	newFleet(t, db, cfg) // the default threshold polls the ticks only
}
