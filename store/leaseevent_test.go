package store

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/flowfabric/ffreconcile/internal/testdb"
)

func TestLeaseEventsAfterAndMax(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	maxID, err := MaxLeaseEventID(ctx, db.Pool)
	if err != nil || maxID != 0 {
		t.Fatalf("MaxLeaseEventID on empty table = %d, %v; want 0, nil", maxID, err)
	}
	_, err = db.Pool.Exec(ctx, `
INSERT INTO ff_lease_event (execution_id, lease_id, event_type, occurred_at_ms, partition_key, namespace, instance_tag)
VALUES ('0b8e5a8e-7c1d-4d2a-9a54-7d1c7e0e0001', NULL, 'acquired', 1000, 3, 'ns', 'i-1'),
       ('0b8e5a8e-7c1d-4d2a-9a54-7d1c7e0e0002', 'l-2', 'renewed', 1001, 200, NULL, NULL),
       ('0b8e5a8e-7c1d-4d2a-9a54-7d1c7e0e0003', NULL, 'expired', 1002, 3, 'ns', NULL),
       ('0b8e5a8e-7c1d-4d2a-9a54-7d1c7e0e0004', NULL, 'revoked', 1003, 0, NULL, 'i-2')`)
	if err != nil {
		t.Fatal(err)
	}

	maxID, err = MaxLeaseEventID(ctx, db.Pool)
	if err != nil || maxID != 4 {
		t.Fatalf("MaxLeaseEventID = %d, %v; want 4, nil", maxID, err)
	}

	got, err := LeaseEventsAfter(ctx, db.Pool, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].EventID != 2 || got[1].EventID != 3 {
		t.Fatalf("LeaseEventsAfter(1, limit 2) = %+v; want ids 2, 3", got)
	}
	r := got[0]
	if r.ExecutionID != "0b8e5a8e-7c1d-4d2a-9a54-7d1c7e0e0002" || r.EventType != "renewed" ||
		r.OccurredAtMs != 1001 || r.PartitionKey != 200 || r.LeaseID == nil || *r.LeaseID != "l-2" ||
		r.Namespace != nil || r.InstanceTag != nil {
		t.Errorf("row 2 scanned as %+v", r)
	}
	if got[1].Namespace == nil || *got[1].Namespace != "ns" || got[1].InstanceTag != nil {
		t.Errorf("row 3 namespace/tag scanned as %v/%v", got[1].Namespace, got[1].InstanceTag)
	}

	got, err = LeaseEventsAfter(ctx, db.Pool, 4, 10)
	if err != nil || len(got) != 0 {
		t.Fatalf("LeaseEventsAfter(4) = %+v, %v; want none", got, err)
	}
}

func TestRunningTransactions(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// A transaction with no xid yet (it has only read) must be listed: it
	// may take a sequence value next.
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	var vxid string
	if err := tx.QueryRow(ctx,
		`SELECT virtualtransaction FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'virtualxid'`).Scan(&vxid); err != nil {
		t.Fatal(err)
	}

	all, inRecovery, err := RunningTransactions(ctx, db.Pool)
	if err != nil || inRecovery {
		t.Fatalf("RunningTransactions: %v, in recovery %v", err, inRecovery)
	}
	if !slices.Contains(all, vxid) {
		t.Fatalf("RunningTransactions = %v; want it to contain the open transaction %s", all, vxid)
	}
	own, _, err := RunningTransactions(ctx, tx)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(own, vxid) {
		t.Errorf("RunningTransactions lists the caller's own transaction %s", vxid)
	}

	running, err := StillRunning(ctx, db.Pool, []string{vxid, "999999/1"})
	if err != nil || !slices.Equal(running, []string{vxid}) {
		t.Fatalf("StillRunning = %v, %v; want [%s]", running, err, vxid)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	running, err = StillRunning(ctx, db.Pool, []string{vxid})
	if err != nil || len(running) != 0 {
		t.Fatalf("StillRunning after commit = %v, %v; want none", running, err)
	}
	if running, err := StillRunning(ctx, db.Pool, nil); err != nil || running != nil {
		t.Fatalf("StillRunning(nil) = %v, %v", running, err)
	}
}

func TestListenLeaseEvents(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if err := ListenLeaseEvents(ctx, conn); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(context.Background(), `UNLISTEN *`) //nolint:errcheck
	if _, err := db.Pool.Exec(ctx, `INSERT INTO ff_lease_event (execution_id, event_type, occurred_at_ms, partition_key)
VALUES ('0b8e5a8e-7c1d-4d2a-9a54-7d1c7e0e0001', 'acquired', 1, 1)`); err != nil {
		t.Fatal(err)
	}
	n, err := conn.Conn().WaitForNotification(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n.Channel != LeaseEventChannel || n.Payload != "1" {
		t.Fatalf("notification %s %q; want %s \"1\"", n.Channel, n.Payload, LeaseEventChannel)
	}
}
