package store_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
)

func TestWorkerHeartbeatUpsertListDelete(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	schema := testdb.RiverSchema

	w := store.WorkerHeartbeat{ClientID: "c1", Hostname: "host-a", PID: 41, Version: "v1"}
	started, err := store.UpsertWorkerHeartbeat(ctx, db.Pool, schema, w)
	if err != nil || started.IsZero() {
		t.Fatalf("first upsert = %v, %v; want a start time", started, err)
	}
	list, err := store.ListWorkerHeartbeats(ctx, db.Pool, schema)
	if err != nil || len(list) != 1 {
		t.Fatalf("list = %+v, %v; want one row", list, err)
	}
	got := list[0]
	if got.ClientID != "c1" || got.Hostname != "host-a" || got.PID != 41 || got.Version != "v1" ||
		!got.StartedAt.Equal(started) || got.Age < 0 || got.Age > time.Minute {
		t.Fatalf("row = %+v; want c1/host-a/41/v1 started %v, age about 0", got, started)
	}

	// Later beats keep the start time and move the heartbeat; a process
	// that restarted under the same client ID replaces host and pid.
	if _, err := db.Pool.Exec(ctx, `UPDATE river.ffreconcile_worker SET heartbeat_at = heartbeat_at - interval '1 minute'`); err != nil {
		t.Fatal(err)
	}
	w.StartedAt, w.PID, w.Version = started, 42, ""
	again, err := store.UpsertWorkerHeartbeat(ctx, db.Pool, schema, w)
	if err != nil || !again.Equal(started) {
		t.Fatalf("second upsert = %v, %v; want the same start %v", again, err, started)
	}
	list, _ = store.ListWorkerHeartbeats(ctx, db.Pool, schema)
	if len(list) != 1 || list[0].PID != 42 || list[0].Version != "" || list[0].Age > 30*time.Second {
		t.Fatalf("after second upsert: %+v; want pid 42, no version, fresh heartbeat", list)
	}

	// A stopping process deletes only its own record.
	deleted, err := store.DeleteWorkerHeartbeat(ctx, db.Pool, schema, "c1", started.Add(time.Second))
	if err != nil || deleted {
		t.Fatalf("delete with another start time = %v, %v; want nothing deleted", deleted, err)
	}
	deleted, err = store.DeleteWorkerHeartbeat(ctx, db.Pool, schema, "c1", started)
	if err != nil || !deleted {
		t.Fatalf("delete = %v, %v; want deleted", deleted, err)
	}
	if list, _ = store.ListWorkerHeartbeats(ctx, db.Pool, schema); len(list) != 0 {
		t.Fatalf("rows after delete: %+v", list)
	}
}

// tagged opens a pool on db whose connections carry tag, as a fleet
// process's do, with one connection open.
func tagged(t *testing.T, pool *pgxpool.Pool, tag string) *pgxpool.Pool {
	t.Helper()
	cfg := pool.Config().Copy()
	cfg.ConnConfig.RuntimeParams["application_name"] = store.ConnTagged("ffreconcile-test", tag)
	cfg.MinConns = 1
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// TestDepartedWorkers: a process is departed when it recorded a connection
// tag and no connection carries it (disconnected), or when its heartbeat is
// older than the stale age; never when the caller cannot see its own tag
// in pg_stat_activity (a pooler that rewrites application_name would
// otherwise make every process look dead), and never the caller itself. A
// regression that judged untagged processes (an earlier version, or
// --poll-only) by their connections would list "untagged" here, and each
// beat would then take over a live process.
func TestDepartedWorkers(t *testing.T) {
	t.Parallel()

	type testBundle struct {
		db                   *testdb.DB
		me, live, dead, lead string // tags
	}
	setup := func(t *testing.T) *testBundle {
		t.Helper()
		ctx := context.Background()
		db := testdb.New(t)
		tb := &testBundle{db: db, me: randomTag(t), live: randomTag(t), dead: randomTag(t), lead: randomTag(t)}
		tagged(t, db.Pool, tb.live) // the live process's connection
		_, err := db.Pool.Exec(ctx, `
			INSERT INTO river.ffreconcile_worker (client_id, hostname, pid, started_at, heartbeat_at, conn_tag)
			VALUES ('me', 'h', 1, now(), now(), $1),
			       ('live', 'h', 2, now(), now(), $2),
			       ('dead', 'h', 3, now(), now() - interval '2 seconds', $3),
			       ('dead-leader', 'h', 4, now(), now() - interval '1 second', $4),
			       ('untagged', 'h', 5, now(), now(), NULL),
			       ('stale-untagged', 'h', 6, now() - interval '1 hour', now() - interval '11 minutes', NULL),
			       ('stale-live', 'h', 7, now() - interval '1 hour', now() - interval '12 minutes', $2)`,
			tb.me, tb.live, tb.dead, tb.lead)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.Pool.Exec(ctx, `INSERT INTO river.river_leader (leader_id, elected_at, expires_at)
			VALUES ('dead-leader', now() - interval '3 seconds', now() + interval '1 hour')`); err != nil {
			t.Fatal(err)
		}
		return tb
	}
	departed := func(t *testing.T, db store.DB, selfTag string, limit int) []string {
		t.Helper()
		got, err := store.DepartedWorkers(context.Background(), db, testdb.RiverSchema, "me", selfTag, 10*time.Minute, limit)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, w := range got {
			s := w.ClientID
			if w.Disconnected {
				s += " disconnected"
			}
			if w.Stale {
				s += " stale"
			}
			if !w.LeaderElectedAt.IsZero() {
				s += " leader"
			}
			out = append(out, s)
		}
		return out
	}

	t.Run("DisconnectedAndStale", func(t *testing.T) {
		t.Parallel()
		tb := setup(t)
		got := departed(t, tagged(t, tb.db.Pool, tb.me), tb.me, 100)
		// Longest silent first.
		want := []string{"stale-live stale", "stale-untagged stale", "dead disconnected", "dead-leader disconnected leader"}
		if !slices.Equal(got, want) {
			t.Fatalf("departed = %q; want %q", got, want)
		}
		if got := departed(t, tagged(t, tb.db.Pool, tb.me), tb.me, 3); len(got) != 3 {
			t.Fatalf("limit 3: %q", got)
		}
	})
	t.Run("NotJudgedWithoutOwnTagInSight", func(t *testing.T) {
		t.Parallel()
		tb := setup(t)
		want := []string{"stale-live stale", "stale-untagged stale"}
		// The caller has no tag (--poll-only), or its connection does
		// not show the one it claims (a pooler's connection).
		if got := departed(t, tb.db.Pool, "", 100); !slices.Equal(got, want) {
			t.Fatalf("without a tag: %q; want %q", got, want)
		}
		if got := departed(t, tb.db.Pool, tb.me, 100); !slices.Equal(got, want) {
			t.Fatalf("with a tag its connection does not carry: %q; want %q", got, want)
		}
	})
	t.Run("OrdinaryRoleSeesOthersConnections", func(t *testing.T) {
		t.Parallel()
		tb := setup(t)
		role := tb.db.PoolAsNewRole(t)
		var name string
		if err := role.QueryRow(context.Background(), `SELECT current_user`).Scan(&name); err != nil {
			t.Fatal(err)
		}
		if _, err := tb.db.Pool.Exec(context.Background(), `GRANT USAGE ON SCHEMA river TO `+pgx.Identifier{name}.Sanitize()+`;
			GRANT SELECT ON river.ffreconcile_worker, river.river_leader TO `+pgx.Identifier{name}.Sanitize()); err != nil {
			t.Fatal(err)
		}
		// application_name of other roles' connections is visible to
		// every role: the live process (a superuser's connection) is
		// not taken for dead.
		got := departed(t, tagged(t, role, tb.me), tb.me, 100)
		want := []string{"stale-live stale", "stale-untagged stale", "dead disconnected", "dead-leader disconnected leader"}
		if !slices.Equal(got, want) {
			t.Fatalf("as an ordinary role: %q; want %q", got, want)
		}
	})
}

func randomTag(t *testing.T) string {
	t.Helper()
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

func TestWorkerHeartbeatErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.NewEmpty(t)
	_, err := store.UpsertWorkerHeartbeat(ctx, db.Pool, "river", store.WorkerHeartbeat{ClientID: "c", Hostname: "h", PID: 1})
	if !errors.Is(err, store.ErrWorkerTableMissing) {
		t.Fatalf("upsert without the table = %v; want ErrWorkerTableMissing", err)
	}
	if _, err := store.ListWorkerHeartbeats(ctx, db.Pool, "x; DROP TABLE y"); err == nil {
		t.Fatal("list with a hostile schema name: want validation error")
	}
}

// TestLeadsWithOthers: a stopping leader hands its ticks on only when it
// leads and another process beat recently. A regression either leaves ticks
// queued behind a fleet that stopped entirely, or makes a stopping leader
// leave its successor the wait for River's staggered start.
func TestLeadsWithOthers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	schema := testdb.RiverSchema
	const liveFor = 15 * time.Second

	tests := []struct {
		name   string
		leader string          // river_leader's leader_id; "" for none
		others []time.Duration // ages of the other processes' heartbeats
		want   bool
	}{
		{"LeaderWithALiveOther", "me", []time.Duration{time.Second}, true},
		{"LeaderAlone", "me", nil, false},
		{"LeaderWithOnlyStaleOthers", "me", []time.Duration{time.Minute, time.Hour}, false},
		{"LeaderWithStaleAndLive", "me", []time.Duration{time.Hour, 2 * time.Second}, true},
		{"AnotherLeads", "other-0", []time.Duration{time.Second}, false},
		{"NoLeader", "", []time.Duration{time.Second}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := db.Pool.Exec(ctx, `DELETE FROM river.river_leader; DELETE FROM river.ffreconcile_worker`); err != nil {
				t.Fatal(err)
			}
			if _, err := store.UpsertWorkerHeartbeat(ctx, db.Pool, schema, store.WorkerHeartbeat{ClientID: "me", Hostname: "h", PID: 1}); err != nil {
				t.Fatal(err)
			}
			for i, age := range tt.others {
				if _, err := db.Pool.Exec(ctx, `
					INSERT INTO river.ffreconcile_worker (client_id, hostname, pid, started_at, heartbeat_at)
					VALUES ($1, 'h', 2, now() - interval '1 hour', now() - $2::bigint * interval '1 millisecond')`,
					fmt.Sprintf("other-%d", i), age.Milliseconds()); err != nil {
					t.Fatal(err)
				}
			}
			if tt.leader != "" {
				if _, err := db.Pool.Exec(ctx, `INSERT INTO river.river_leader (leader_id, elected_at, expires_at) VALUES ($1, now(), now() + interval '15 seconds')`, tt.leader); err != nil {
					t.Fatal(err)
				}
			}
			got, err := store.LeadsWithOthers(ctx, db.Pool, schema, "me", liveFor)
			if err != nil || got != tt.want {
				t.Fatalf("LeadsWithOthers = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
	if _, err := store.LeadsWithOthers(ctx, db.Pool, "no such schema!", "me", liveFor); err == nil {
		t.Fatal("LeadsWithOthers accepted an invalid schema name")
	}
}
