package leasehistory_test

import (
	"context"
	"testing"
	"time"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/internal/fleettest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/leasehistory"
	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

// TestReconcilerEventsArriveOnTheStream: the `expired` events the
// lease-expiry reconciler writes in its row transactions reach a filtered
// subscriber tailing from now, each once, with FlowFabric's execution id form
// and the execution's namespace and instance tag; the other tenant's do not.
func TestReconcilerEventsArriveOnTheStream(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sub := subscribe(t, ctx, db.Pool, leasehistory.Options{Namespace: "tenant-a"})

	now := store.NowMs()
	want := map[string]int{}
	for i := range 6 {
		p := int16(10 + i)
		ns := "tenant-a"
		if i%3 == 2 {
			ns = "tenant-b" // filtered out
		}
		id := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p, Namespace: ns,
			Tags: map[string]string{"cairn.instance_id": "inst-9"}})
		fftest.InsertAttempt(t, db.Pool, p, id, 0, fftest.Ms(now-100))
		if ns == "tenant-a" {
			want[jobs.ExecutionID{Partition: p, UUID: id}.String()] = int(p)
		}
	}
	fleettest.Start(t, db, fleet.Config{Reconcilers: fleettest.Fast(workers.LeaseExpiry)})

	// Ranging over want while deleting from it would stop early: take
	// exactly as many events as are wanted, then check none is missing.
	for range len(want) {
		ev := next(t, sub)
		p, ok := want[ev.ExecutionID]
		if !ok {
			t.Fatalf("unexpected event %+v", ev)
		}
		delete(want, ev.ExecutionID)
		if ev.Type != leasehistory.EventExpired || ev.Partition != p || ev.Namespace != "tenant-a" || ev.InstanceTag != "inst-9" {
			t.Fatalf("event = %+v; want expired, partition %d, tenant-a, inst-9", ev, p)
		}
	}
	if len(want) != 0 {
		t.Fatalf("no event for %v", want)
	}
}
