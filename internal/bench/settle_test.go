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
			before := checkpointLSN(t, db)
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
				// A CHECKPOINT returns once a checkpoint that started after it
				// was asked for has finished, so the last checkpoint's record
				// moves on. (Counting requested checkpoints does not work:
				// requests made while one runs, other tests' included, are
				// served by one checkpoint.)
				if after := checkpointLSN(t, db); after <= before {
					t.Errorf("last checkpoint at %s before settle and %s after; want it to move on", before, after)
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

// checkpointLSN is where the server's last checkpoint record is, as a
// number that grows with the WAL.
func checkpointLSN(t *testing.T, db *testdb.DB) string {
	t.Helper()
	var lsn string
	err := db.Pool.QueryRow(context.Background(),
		`SELECT lpad(to_hex((checkpoint_lsn - '0/0'::pg_lsn)::bigint), 16, '0') FROM pg_control_checkpoint()`).Scan(&lsn)
	if err != nil {
		t.Fatal(err)
	}
	return lsn
}
