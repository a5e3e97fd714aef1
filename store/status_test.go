package store_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
)

func TestRiverStatusQueries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	schema := testdb.RiverSchema

	for _, tt := range []struct {
		schema string
		want   bool
	}{{schema, true}, {"nowhere", false}} {
		got, err := store.RiverSchemaExists(ctx, db.Pool, tt.schema)
		if err != nil || got != tt.want {
			t.Errorf("RiverSchemaExists(%s) = %v, %v; want %v", tt.schema, got, err, tt.want)
		}
		got, err = store.WorkerTableExists(ctx, db.Pool, tt.schema)
		if err != nil || got != tt.want {
			t.Errorf("WorkerTableExists(%s) = %v, %v; want %v", tt.schema, got, err, tt.want)
		}
	}
	if _, err := store.RiverSchemaExists(ctx, db.Pool, "a.b"); err == nil {
		t.Error("RiverSchemaExists(a.b): want validation error")
	}
	// CheckRiverSchema: nil where River's tables are, else an error naming
	// the schema, the database looked in and the command that fixes it.
	if err := store.CheckRiverSchema(ctx, db.Pool, schema); err != nil {
		t.Errorf("CheckRiverSchema(%s): %v", schema, err)
	}
	var dbName string
	if err := db.Pool.QueryRow(ctx, `SELECT current_database()`).Scan(&dbName); err != nil {
		t.Fatal(err)
	}
	err := store.CheckRiverSchema(ctx, db.Pool, "nowhere")
	for _, want := range []string{`schema "nowhere"`, `database "` + dbName + `"`, "worker migrate"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("CheckRiverSchema(nowhere) = %v; want an error containing %q", err, want)
		}
	}

	// Jobs: three row jobs available, one scan scheduled, and one job of a
	// queue that is not the fleet's, which must not be counted.
	client, err := river.NewClient(riverpgxv5.New(db.Pool), &river.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := client.Insert(ctx, jobs.LeaseReleaseArgs{Partition: 1, ExecutionID: fftest.NewUUID(), AttemptIndex: int32(i)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client.Insert(ctx, jobs.LeaseExpiryScanArgs{ScanArgs: jobs.ScanArgs{Partition: 4}}, &river.InsertOpts{ScheduledAt: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Insert(ctx, jobs.LeaseExpiryScanArgs{ScanArgs: jobs.ScanArgs{Partition: 5}}, &river.InsertOpts{Queue: "other"}); err != nil {
		t.Fatal(err)
	}
	queues := []string{jobs.QueueControl, jobs.QueueRows}
	depth, err := store.RiverQueueDepth(ctx, db.Pool, schema, queues)
	if err != nil {
		t.Fatal(err)
	}
	want := []store.QueueStateCount{{jobs.QueueControl, "scheduled", 1}, {jobs.QueueRows, "available", 3}}
	if len(depth) != len(want) || depth[0] != want[0] || depth[1] != want[1] {
		t.Fatalf("RiverQueueDepth = %+v; want %+v", depth, want)
	}
	kinds, err := store.RiverUnfinishedByKind(ctx, db.Pool, schema, queues)
	if err != nil {
		t.Fatal(err)
	}
	wantKinds := []store.KindCount{{jobs.KindLeaseRelease, 3}, {jobs.KindLeaseExpiryScan, 1}}
	if len(kinds) != 2 || kinds[0] != wantKinds[0] || kinds[1] != wantKinds[1] {
		t.Fatalf("RiverUnfinishedByKind = %+v; want %+v", kinds, wantKinds)
	}

	// Leader: none, then one elected 5 s ago holding 10 s more.
	if l, err := store.CurrentRiverLeader(ctx, db.Pool, schema); err != nil || l != nil {
		t.Fatalf("CurrentRiverLeader on a fresh schema = %+v, %v; want nil", l, err)
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO river.river_leader (leader_id, elected_at, expires_at)
		VALUES ('client-a', now() - interval '5 seconds', now() + interval '10 seconds')`); err != nil {
		t.Fatal(err)
	}
	l, err := store.CurrentRiverLeader(ctx, db.Pool, schema)
	if err != nil || l == nil {
		t.Fatalf("CurrentRiverLeader = %+v, %v", l, err)
	}
	if l.LeaderID != "client-a" || l.ElectedAgo < 4*time.Second || l.ElectedAgo > time.Minute ||
		l.ExpiresIn <= 0 || l.ExpiresIn > 10*time.Second {
		t.Fatalf("leader = %+v; want client-a elected about 5s ago, expiring within 10s", l)
	}
}
