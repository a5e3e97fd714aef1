package testdb

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { Main(m) }

// exists reports whether the server has a database named name.
func exists(t *testing.T, name string) bool {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	var ok bool
	if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

// isSpare reports whether name waits, emptied, for the next test.
func isSpare(name string) bool {
	spares.Lock()
	defer spares.Unlock()
	for _, names := range spares.byTemplate {
		for _, n := range names {
			if n == name {
				return true
			}
		}
	}
	return false
}

// TestReuse: a database whose test ended is handed to the next test empty
// (no ff_ or River rows, sequences from their start) whatever connections
// the test left open, and a database whose test changed its catalog or left
// many rows is dropped. A regression shows as a test seeing another's rows,
// an event id that depends on test order, or a changed schema passed on.
// Not parallel: the spares are the process's.
func TestReuse(t *testing.T) {
	ctx := context.Background()

	tests := []struct {
		name  string
		dirty func(t *testing.T, db *DB)
		reuse bool
	}{
		{name: "RowsAndAnOpenConnection", reuse: true, dirty: func(t *testing.T, db *DB) {
			if _, err := db.Pool.Exec(ctx, `
				INSERT INTO ff_lease_event (execution_id, event_type, occurred_at_ms, partition_key) VALUES ('x', 'expired', 1, 1);
				INSERT INTO river.river_job (args, kind, max_attempts, queue, state) VALUES ('{}', 'k', 1, 'q', 'available');
				INSERT INTO river.river_leader (leader_id, elected_at, expires_at) VALUES ('me', now(), now() + interval '1 minute')`); err != nil {
				t.Fatal(err)
			}
			// Left open, as a worker process killed late would leave it.
			conn, err := pgx.Connect(ctx, db.URL)
			if err != nil {
				t.Fatal(err)
			}
			_ = conn
		}},
		{name: "ChangedCatalog", reuse: false, dirty: func(t *testing.T, db *DB) {
			if _, err := db.Pool.Exec(ctx, `ALTER TABLE ff_exec_core ADD COLUMN extra int`); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "CommentAdded", reuse: false, dirty: func(t *testing.T, db *DB) {
			if _, err := db.Pool.Exec(ctx, `COMMENT ON TABLE ff_attempt IS 'changed'`); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "ManyRows", reuse: false, dirty: func(t *testing.T, db *DB) {
			if _, err := db.Pool.Exec(ctx, `INSERT INTO ff_lease_event (execution_id, event_type, occurred_at_ms, partition_key)
				SELECT 'x', 'expired', g, 1 FROM generate_series(1, $1::int) g`, maxReusedRows+1); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var name string
			t.Run("Dirty", func(t *testing.T) {
				db := New(t)
				name = db.Name
				tt.dirty(t, db)
			})
			if got := isSpare(name); got != tt.reuse {
				t.Fatalf("spare after the test: %v; want %v", got, tt.reuse)
			}
			if got := exists(t, name); got != tt.reuse {
				t.Fatalf("database exists after the test: %v; want %v", got, tt.reuse)
			}
			if !tt.reuse {
				return
			}
			db := New(t)
			if db.Name != name {
				t.Fatalf("next test got %s; want the spare %s", db.Name, name)
			}
			var rows int
			var eventID int64
			if err := db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM ff_lease_event) + (SELECT count(*) FROM river.river_job)
				  + (SELECT count(*) FROM river.river_leader)`).Scan(&rows); err != nil {
				t.Fatal(err)
			}
			if err := db.Pool.QueryRow(ctx, `INSERT INTO ff_lease_event (execution_id, event_type, occurred_at_ms, partition_key)
				VALUES ('y', 'expired', 1, 1) RETURNING event_id`).Scan(&eventID); err != nil {
				t.Fatal(err)
			}
			if rows != 0 || eventID != 1 {
				t.Fatalf("reused database: %d rows left, next event id %d; want 0 and 1", rows, eventID)
			}
		})
	}
}
