package fleet_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/internal/fleettest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/workers"
)

// TestStoppingLeaderStartsTheTicks: a leader stopping cleanly, with another
// process left, inserts the ticks for its successor as soon as it has
// resigned (tagged leader-handoff), and the successor runs them; the last
// process stopping inserts none. The tick interval is ten minutes, so
// River's schedule inserts nothing during the test and every tick is either
// a leader's RunOnStart or the handoff's: the tag proves which. A regression
// leaves ticks to the new leader's RunOnStart, which River starts 0-6 s
// after the election (its maintenance services start one after another,
// each after a pause of up to a second), or leaves a tick queued behind a
// fleet that stopped entirely.
func TestStoppingLeaderStartsTheTicks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	cfg := fleet.Config{Reconcilers: map[string]time.Duration{workers.CancelReconcile.Name: 10 * time.Minute}}
	kind := workers.CancelReconcile.TickArgs().Kind()
	handoffTicks := func() (n int, attemptedBy []string) {
		t.Helper()
		err := db.Pool.QueryRow(ctx, `
			SELECT count(*), COALESCE(max(attempted_by::text), '{}')::text[]
			  FROM river.river_job WHERE kind = $1 AND $2 = ANY(tags) AND state = 'completed'`,
			kind, fleet.TagLeaderHandoff).Scan(&n, &attemptedBy)
		if err != nil && err != pgx.ErrNoRows {
			t.Fatal(err)
		}
		return n, attemptedBy
	}
	leader := func() string {
		var id string
		if err := db.Pool.QueryRow(ctx, `SELECT leader_id FROM river.river_leader`).Scan(&id); err != nil && err != pgx.ErrNoRows {
			t.Fatal(err)
		}
		return id
	}

	first := fleettest.Start(t, db, cfg)
	fleettest.WaitFor(t, fleettest.Patient, "the first process to lead", func() (bool, string) {
		return leader() == first.Client.ID(), "leader " + leader()
	})
	second := fleettest.Start(t, db, cfg)
	stopCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := first.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	// The handoff's insert is part of Stop: its tick is in the table now.
	var queued int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM river.river_job WHERE kind = $1 AND $2 = ANY(tags)`,
		kind, fleet.TagLeaderHandoff).Scan(&queued); err != nil || queued != 1 {
		t.Fatalf("ticks tagged %s once the leader stopped: %d, %v; want 1", fleet.TagLeaderHandoff, queued, err)
	}
	fleettest.WaitFor(t, fleettest.Patient, "the survivor to run the handed-off tick", func() (bool, string) {
		n, by := handoffTicks()
		return n == 1 && len(by) == 1 && by[0] == second.Client.ID(), fleettest.Statusf("%d completed, attempted by %v", n, by)
	})
	fleettest.WaitFor(t, fleettest.Patient, "the survivor to lead", func() (bool, string) {
		return leader() == second.Client.ID(), "leader " + leader()
	})

	// The last process stops alone: nobody to hand the ticks to.
	if err := second.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM river.river_job WHERE kind = $1 AND $2 = ANY(tags)`,
		kind, fleet.TagLeaderHandoff).Scan(&queued); err != nil || queued != 1 {
		t.Fatalf("ticks tagged %s after the last process stopped: %d, %v; want still 1", fleet.TagLeaderHandoff, queued, err)
	}
}
