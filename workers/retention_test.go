package workers_test

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/internal/fleettest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

// siblingsEach is what fftest.SiblingRows returns for an execution whose
// fftest.InsertSiblings rows are all there (1) or all gone (0).
func siblingsEach(n int) map[string]int { return fftest.SiblingsEach(n) }

// TestRetentionTrimsOnlyExpiredTerminalExecutions runs the retention
// reconciler in a fleet with a one-hour retention and a batch of two:
// terminal executions that ended two hours ago, five of them in one
// partition (its trim takes three batches) and one in another, go with
// every sibling row; an execution that ended ten minutes ago, an active one
// and another tenant's are left whole. A regression shows as a kept row
// deleted, a sibling row left behind, or the partition's backlog stopping
// after its first batch.
func TestRetentionTrimsOnlyExpiredTerminalExecutions(t *testing.T) {
	t.Parallel()
	testdb.EachSchema(t, func(t *testing.T, db *testdb.DB) {
		retentionTrims(t, db)
	})
}

func retentionTrims(t *testing.T, db *testdb.DB) {
	pool := db.Pool
	now := time.Now().UnixMilli()
	old, recent := now-2*time.Hour.Milliseconds(), now-10*time.Minute.Milliseconds()

	type row struct {
		p   int16
		id  string
		due bool
	}
	var rows []row
	add := func(e fftest.Exec, due bool) {
		e.Namespace = "acme"
		id := fftest.InsertExec(t, pool, e)
		fftest.InsertSiblings(t, pool, e.Partition, id, fftest.NewUUID())
		rows = append(rows, row{e.Partition, id, due})
	}
	for i := range 5 {
		add(fftest.Terminal(40, old+int64(i)), true)
	}
	add(fftest.Terminal(41, old), true)
	add(fftest.Terminal(40, recent), false)
	add(fftest.Exec{Partition: 40, TerminalAtMs: fftest.Ms(old)}, false) // active, with an old terminal_at_ms
	other := fftest.Terminal(40, old)
	other.Namespace = "beta"
	otherID := fftest.InsertExec(t, pool, other)
	fftest.InsertSiblings(t, pool, 40, otherID, fftest.NewUUID())

	f := fleettest.Start(t, db, fleet.Config{Reconcilers: fleettest.Fast(workers.Retention), Settings: workers.Values{workers.RetentionAge: time.Hour},
		BatchSize: 2, Filter: store.Filter{Namespace: "acme"}})
	c := f.Workers.Stats().For(workers.Retention.Name)
	fleettest.WaitFor(t, fleettest.Patient, "the expired executions trimmed", func() (bool, string) {
		n := fftest.Count(t, pool, `SELECT count(*) FROM ff_exec_core WHERE terminal_at_ms = ANY($1) AND lifecycle_phase = 'terminal' AND raw_fields->>'namespace' = 'acme'`,
			[]int64{old, old + 1, old + 2, old + 3, old + 4})
		return n == 0, fleettest.Statusf("%d left; %+v", n, c.Snapshot())
	})
	waitTicks(t, f, workers.Retention, 2)
	for _, r := range rows {
		want := siblingsEach(1)
		if r.due {
			want = siblingsEach(0)
		}
		if got := fftest.SiblingRows(t, pool, r.p, r.id); !maps.Equal(got, want) {
			t.Errorf("partition %d execution %s (due %v): sibling rows %v; want %v", r.p, r.id, r.due, got, want)
		}
	}
	if got := fftest.SiblingRows(t, pool, 40, otherID); !maps.Equal(got, siblingsEach(1)) {
		t.Errorf("another tenant's execution lost sibling rows: %v", got)
	}
	if n := fftest.Count(t, pool, `SELECT count(*) FROM ff_exec_core`); n != 3 {
		t.Errorf("%d executions left; want 3 (recent, active, other tenant's)", n)
	}
	s := c.Snapshot()
	if s.Applied != 6 || s.Errors != 0 {
		t.Errorf("counters %+v; want 6 applied, no errors", s)
	}
	// Its jobs carry the reconciler's and the tenant's tags (River UI's
	// tag filter).
	trims := fftest.Count(t, pool, `SELECT count(*) FROM `+testdb.RiverSchema+`.river_job WHERE kind = 'ff.retention.trim'`)
	tagged := fftest.Count(t, pool, `SELECT count(*) FROM `+testdb.RiverSchema+`.river_job
		WHERE kind = 'ff.retention.trim' AND tags @> ARRAY['retention', 'tenant-acme']::varchar[]`)
	if trims == 0 || tagged != trims {
		t.Errorf("%d of %d trim jobs tagged retention and tenant-acme; want all", tagged, trims)
	}
}

// TestOutboxRetention runs the outbox trim in a fleet: lease events and
// dispatched completion events older than the outbox retention go, even
// though their execution is alive; recent ones and an old undispatched
// completion event stay, and the lease outbox's trim mark is recorded. A
// regression deletes recent history or an event the dispatcher still owes.
func TestOutboxRetention(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	pool := db.Pool
	ctx := context.Background()
	now := time.Now().UnixMilli()
	old, recent := now-2*time.Hour.Milliseconds(), now-time.Minute.Milliseconds()
	exec := fftest.InsertExec(t, pool, fftest.Exec{Partition: 7})
	for _, at := range []int64{old, old + 1, old + 2, recent} {
		if _, err := pool.Exec(ctx, `INSERT INTO ff_lease_event (execution_id, event_type, occurred_at_ms, partition_key) VALUES ($1, 'renewed', $2, 7)`, exec, at); err != nil {
			t.Fatal(err)
		}
	}
	for _, e := range []struct {
		at         int64
		dispatched bool
	}{{old, true}, {old, false}, {recent, true}} {
		var d *int64
		if e.dispatched {
			d = fftest.Ms(e.at)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO ff_completion_event (partition_key, execution_id, outcome, occurred_at_ms, committed_at_ms, dispatched_at_ms)
			VALUES (7, $1, 'success', $2, $2, $3)`, fftest.NewUUID(), e.at, d); err != nil {
			t.Fatal(err)
		}
	}

	f := fleettest.Start(t, db, fleet.Config{Reconcilers: fleettest.Fast(workers.OutboxRetention), Settings: workers.Values{workers.OutboxAge: time.Hour}})
	c := f.Workers.Stats().For(workers.OutboxRetention.Name)
	fleettest.WaitFor(t, fleettest.Patient, "the old events trimmed", func() (bool, string) {
		return c.Applied.Load() >= 4, fleettest.Statusf("%+v", c.Snapshot())
	})
	if got := fftest.Count(t, pool, `SELECT count(*) FROM ff_lease_event WHERE occurred_at_ms = $1`, recent); got != 1 {
		t.Errorf("recent lease event kept: %d; want 1", got)
	}
	if got := fftest.Count(t, pool, `SELECT count(*) FROM ff_lease_event`); got != 1 {
		t.Errorf("%d lease events left; want only the recent one", got)
	}
	if got := fftest.Count(t, pool, `SELECT count(*) FROM ff_completion_event WHERE dispatched_at_ms IS NULL`); got != 1 {
		t.Errorf("undispatched completion events left: %d; want 1", got)
	}
	if got := fftest.Count(t, pool, `SELECT count(*) FROM ff_completion_event`); got != 2 {
		t.Errorf("%d completion events left; want the undispatched and the recent one", got)
	}
	if through, err := store.LeaseEventsTrimmedThrough(ctx, pool); err != nil || through == 0 {
		t.Errorf("trim mark = %d, %v; want the last deleted event's id", through, err)
	}
	if n := fftest.Count(t, pool, `SELECT count(*) FROM ff_exec_core`); n != 1 {
		t.Errorf("the execution itself must stay")
	}
	if s := c.Snapshot(); s.Applied != 4 || s.Errors != 0 {
		t.Errorf("counters %+v; want 4 applied (3 lease, 1 completion), no errors", s)
	}
}
