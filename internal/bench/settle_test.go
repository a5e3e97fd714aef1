package bench

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/flowfabric/ffreconcile/internal/testdb"
)

// TestSettle: settle analyzes and checkpoints as a role allowed to; a role
// that may not CHECKPOINT gets its statistics, one warning for any number of
// loads, and no error, so the benchmark still runs.
func TestSettle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.NewEmpty(t)

	tests := []struct {
		name           string
		unprivileged   bool
		wantCheckpoint bool
	}{
		{name: "Superuser", wantCheckpoint: true},
		{name: "RoleWithoutCheckpointRights", unprivileged: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pool := db.Pool
			table := "settle_" + strings.ToLower(tt.name)
			if tt.unprivileged {
				pool = db.PoolAsNewRole(t)
			}
			// The table belongs to the role running settle, so its ANALYZE
			// covers it either way.
			if _, err := pool.Exec(ctx, `CREATE TABLE `+table+` AS SELECT g FROM generate_series(1, 1000) g`); err != nil {
				t.Fatal(err)
			}
			var logs bytes.Buffer
			e := &env{pool: pool, log: slog.New(slog.NewTextHandler(&logs, nil))}
			before := checkpoints(t, db)
			for range 2 {
				if err := e.settle(ctx, false); err != nil {
					t.Fatalf("settle: %v", err)
				}
			}
			var analyzed bool
			if err := pool.QueryRow(ctx, `SELECT last_analyze IS NOT NULL FROM pg_stat_user_tables WHERE relname = $1`, table).Scan(&analyzed); err != nil {
				t.Fatal(err)
			}
			if !analyzed {
				t.Errorf("%s not analyzed", table)
			}
			warnings := strings.Count(logs.String(), "CHECKPOINT refused")
			if tt.wantCheckpoint {
				// Other tests' DROP DATABASE checkpoint too, so only a lower
				// bound holds.
				if after := checkpoints(t, db); after < before+2 {
					t.Errorf("checkpoints went from %d to %d; want at least 2 more", before, after)
				}
				if warnings != 0 || e.noCheckpoint {
					t.Errorf("warned %d times (noCheckpoint %v); want no warning:\n%s", warnings, e.noCheckpoint, logs.String())
				}
			} else if warnings != 1 || !e.noCheckpoint {
				t.Errorf("warned %d times (noCheckpoint %v); want once:\n%s", warnings, e.noCheckpoint, logs.String())
			}
		})
	}
}

// checkpoints is the server's count of requested checkpoints (in
// pg_stat_checkpointer from PostgreSQL 17 on).
func checkpoints(t *testing.T, db *testdb.DB) int64 {
	t.Helper()
	ctx := context.Background()
	var version int
	if err := db.Pool.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	q := `SELECT checkpoints_req FROM pg_stat_bgwriter`
	if version >= 170000 {
		q = `SELECT num_requested FROM pg_stat_checkpointer`
	}
	var n int64
	if err := db.Pool.QueryRow(ctx, q).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
