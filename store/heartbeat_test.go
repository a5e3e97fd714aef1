package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

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

func TestDeleteStaleWorkerHeartbeatsIsBoundedAndOldestFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	// Three processes that died 11, 12 and 13 minutes ago, two alive.
	_, err := db.Pool.Exec(ctx, `
		INSERT INTO river.ffreconcile_worker (client_id, hostname, pid, started_at, heartbeat_at)
		SELECT 'c' || i, 'h', i, now() - interval '1 hour', now() - i * interval '1 minute'
		  FROM unnest(ARRAY[0, 1, 11, 12, 13]) AS i`)
	if err != nil {
		t.Fatal(err)
	}
	remaining := func() []string {
		list, err := store.ListWorkerHeartbeats(ctx, db.Pool, testdb.RiverSchema)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, w := range list {
			ids = append(ids, w.ClientID)
		}
		return ids
	}
	for _, step := range []struct {
		want int64
		left int
	}{{2, 3}, {1, 2}, {0, 2}} {
		n, err := store.DeleteStaleWorkerHeartbeats(ctx, db.Pool, testdb.RiverSchema, 10*time.Minute, 2)
		if err != nil || n != step.want {
			t.Fatalf("DeleteStaleWorkerHeartbeats = %d, %v; want %d", n, err, step.want)
		}
		if ids := remaining(); len(ids) != step.left {
			t.Fatalf("after deleting %d: rows %v; want %d", n, ids, step.left)
		}
	}
	// The limit took the oldest first: c13 and c12 went in the first step.
	if ids := remaining(); !(len(ids) == 2 && ((ids[0] == "c0" && ids[1] == "c1") || (ids[0] == "c1" && ids[1] == "c0"))) {
		t.Fatalf("survivors %v; want c0 and c1", ids)
	}
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
