package workers_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/internal/fleettest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

// TestLeaseExpiryBacklogLargerThanBatchDrains: 35 due rows in one partition
// with a batch of 10 all drain, through scans that continue themselves.
func TestLeaseExpiryBacklogLargerThanBatchDrains(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	now := store.NowMs()
	for i := range 35 {
		id := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: 42})
		fftest.InsertAttempt(t, db.Pool, 42, id, 0, fftest.Ms(now-int64(1000+i)))
	}
	f := fleettest.Start(t, db, fleet.Config{
		Reconcilers: map[string]time.Duration{workers.LeaseExpiry.Name: 30 * time.Second}, // one tick (RunOnStart)
		BatchSize:   10,
	})
	fleettest.WaitFor(t, fleettest.Patient, "all 35 leases released", func() (bool, string) {
		n := fftest.Count(t, db.Pool, `SELECT count(*) FROM ff_attempt WHERE lease_expires_at_ms IS NOT NULL`)
		return n == 0, fleettest.Statusf("%d leases left", n)
	})
	st := f.Workers.Stats().For(workers.LeaseExpiry.Name).Snapshot()
	if st.Continuations < 3 {
		t.Fatalf("continuations = %d; a 35-row backlog with batch 10 needs at least 3 (stats %+v)", st.Continuations, st)
	}
	if n := fftest.Count(t, db.Pool, `SELECT count(*) FROM ff_lease_event WHERE event_type = 'expired'`); n != 35 {
		t.Fatalf("%d expired events; want 35", n)
	}
}

// TestLeaseExpiryTwoClientsExactlyOnce runs two fleet processes on one
// database: every expired lease is released exactly once, proven by counting
// lease events per attempt (a second application would write a second one).
// Leases keep expiring while both run, so both processes race on scans and
// row jobs through River's uniqueness; and the expired ones also have two
// duplicate release jobs each, without a unique key, so the two processes
// run the same row's action at once and only the row-level re-check keeps
// it to one effect. The test fails unless both processes ran row jobs and
// the duplicates ended as no-ops.
func TestLeaseExpiryTwoClientsExactlyOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	const rows = 600
	now := store.NowMs()
	// Half already expired, each with two duplicate release jobs; half
	// expire over the next two seconds.
	var dups []string
	for i := range rows {
		p := int16(i % 256)
		id := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p, Namespace: "ns"})
		exp := now - 1000
		if i%2 == 1 {
			exp = now + int64(i)*2000/rows
		} else {
			dups = append(dups, fmt.Sprintf(`{"partition": %d, "execution_id": %q, "attempt_index": 0}`, p, id))
		}
		fftest.InsertAttempt(t, db.Pool, p, id, 0, fftest.Ms(exp))
	}
	duplicateRowJobs(t, db, jobs.KindLeaseRelease, dups, 2)
	cfg := fleet.Config{Reconcilers: fleettest.Fast(workers.LeaseExpiry), BatchSize: 50}
	f1 := fleettest.Start(t, db, cfg)
	f2 := fleettest.Start(t, db, cfg)

	fleettest.WaitFor(t, 3*time.Minute, "every lease released", func() (bool, string) {
		n := fftest.Count(t, db.Pool, `SELECT count(*) FROM ff_attempt WHERE lease_expires_at_ms IS NOT NULL`)
		return n == 0, fleettest.Statusf("%d leases left", n)
	})
	if n := fftest.Count(t, db.Pool, `SELECT count(*) FROM ff_lease_event`); n != rows {
		t.Fatalf("%d lease events for %d leases; want exactly one each", n, rows)
	}
	if n := fftest.Count(t, db.Pool, `SELECT count(*) FROM (SELECT execution_id FROM ff_lease_event GROUP BY 1 HAVING count(*) > 1) d`); n != 0 {
		t.Fatalf("%d executions have more than one expired event", n)
	}
	if n := fftest.Count(t, db.Pool, `SELECT count(*) FROM ff_exec_core WHERE lifecycle_phase <> 'runnable'`); n != 0 {
		t.Fatalf("%d executions not flipped to runnable", n)
	}
	s1 := f1.Workers.Stats().For(workers.LeaseExpiry.Name).Snapshot()
	s2 := f2.Workers.Stats().For(workers.LeaseExpiry.Name).Snapshot()
	if s1.Applied+s2.Applied != rows {
		t.Fatalf("applied %d + %d; want %d", s1.Applied, s2.Applied, rows)
	}
	requireBothRaced(t, workers.LeaseExpiry, f1, f2, len(dups))
	// Nothing left behind in River.
	fleettest.WaitFor(t, fleettest.Patient, "no unfinished River jobs for rows", func() (bool, string) {
		var n int
		err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM river.river_job WHERE kind = $1 AND state NOT IN ('completed')`,
			jobs.KindLeaseRelease).Scan(&n)
		return err == nil && n == 0, fleettest.Statusf("%d unfinished release jobs (err %v)", n, err)
	})
}

// TestLeaseExpiryFilterLimitsTheFleet: a fleet limited to one tenant never
// touches other tenants' rows, nor attempts without an execution row.
func TestLeaseExpiryFilterLimitsTheFleet(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	now := store.NowMs()
	mine := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: 1, Namespace: "mine", Tags: map[string]string{"cairn.instance_id": "i-1"}})
	wrongTag := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: 1, Namespace: "mine", Tags: map[string]string{"cairn.instance_id": "i-2"}})
	other := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: 2, Namespace: "other"})
	orphan := fftest.NewUUID()
	for _, id := range []string{mine, wrongTag} {
		fftest.InsertAttempt(t, db.Pool, 1, id, 0, fftest.Ms(now-10))
	}
	fftest.InsertAttempt(t, db.Pool, 2, other, 0, fftest.Ms(now-10))
	fftest.InsertAttempt(t, db.Pool, 3, orphan, 0, fftest.Ms(now-10))

	f := fleettest.Start(t, db, fleet.Config{
		Reconcilers: fleettest.Fast(workers.LeaseExpiry),
		Filter:      store.Filter{Namespace: "mine", TagKey: "cairn.instance_id", TagValue: "i-1"},
	})
	fleettest.WaitFor(t, fleettest.Patient, "the tenant's lease released", func() (bool, string) {
		att := fftest.ReadAttempt(t, db.Pool, 1, mine, 0)
		return att.LeaseExpiresAtMs == nil, "still leased"
	})
	// Let a few more ticks pass, then check nothing else was touched.
	ticks := f.Workers.Stats().For(workers.LeaseExpiry.Name).Ticks.Load()
	fleettest.WaitFor(t, fleettest.Patient, "three more ticks", func() (bool, string) {
		n := f.Workers.Stats().For(workers.LeaseExpiry.Name).Ticks.Load()
		return n >= ticks+3, fleettest.Statusf("%d ticks", n)
	})
	if n := fftest.Count(t, db.Pool, `SELECT count(*) FROM ff_attempt WHERE lease_expires_at_ms IS NOT NULL`); n != 3 {
		t.Fatalf("%d leases still held; want 3 (other tenant, other tag, orphan)", n)
	}
	if n := fftest.Count(t, db.Pool, `SELECT count(*) FROM ff_lease_event`); n != 1 {
		t.Fatalf("%d events; want 1", n)
	}
}
