package store_test

import (
	"context"
	"maps"
	"testing"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
)

// allSiblings is what fftest.SiblingRows returns for an execution whose
// fftest.InsertSiblings rows are all there (1) or all gone (0).
func allSiblings(n int) map[string]int { return fftest.SiblingsEach(n) }

// TestTrimExecutions: ended executions (terminal, and cancelled as
// FlowFabric's Postgres cancels leave them) whose terminal_at_ms is at or
// before the cutoff are deleted with their rows in every sibling table (in
// the text tables under the bare uuid and the wire id),
// oldest first and at most the batch; everything else stays whole, side by
// side with them in the same partition: a terminal execution ended after
// the cutoff, an active one whose terminal_at_ms is old (a replayed
// execution keeps it), a terminal one without terminal_at_ms, and a due one
// of another partition. A second trim deletes nothing. A regression shows
// as a kept execution or sibling row gone, a trimmed execution's sibling
// row left behind, or the batch order or limit broken.
func TestTrimExecutions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t).Pool
	const cutoff, p, other = int64(1_700_000_000_000), int16(9), int16(10)

	type row struct {
		name string
		exec fftest.Exec
		due  bool
	}
	active := fftest.Exec{Partition: p, TerminalAtMs: fftest.Ms(cutoff - 5000)}
	cancelled := fftest.Terminal(p, cutoff-1000)
	cancelled.LifecyclePhase, cancelled.EligibilityState, cancelled.PublicState = "cancelled", "cancelled", "cancelled"
	noTime := fftest.Terminal(p, 0)
	noTime.TerminalAtMs = nil
	rows := []row{
		{"Oldest", fftest.Terminal(p, cutoff-3000), true},
		{"Older", fftest.Terminal(p, cutoff-2000), true},
		{"Cancelled", cancelled, true},
		{"AtTheCutoff", fftest.Terminal(p, cutoff), true},
		{"AfterTheCutoff", fftest.Terminal(p, cutoff+1), false},
		{"ActiveWithOldTerminalAt", active, false},
		{"TerminalWithoutTerminalAt", noTime, false},
		{"OtherPartition", fftest.Terminal(other, cutoff-9000), false},
	}
	ids := map[string]string{}
	for _, r := range rows {
		id := fftest.InsertExec(t, pool, r.exec)
		ids[r.name] = id
		fftest.InsertSiblings(t, pool, r.exec.Partition, id, fftest.NewUUID())
	}
	exists := func(name string) bool {
		for _, r := range rows {
			if r.name == name {
				return fftest.Count(t, pool, `SELECT count(*) FROM ff_exec_core WHERE partition_key = $1 AND execution_id = $2`, r.exec.Partition, ids[name]) == 1
			}
		}
		panic(name)
	}

	// A batch of two takes the two oldest.
	res, err := store.TrimExecutions(ctx, pool, p, cutoff, 2, store.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Executions != 2 || res.SiblingRows != int64(2*fftest.SiblingRowsEach) || res.OldestTerminalMs != cutoff-3000 {
		t.Fatalf("first batch = %+v; want 2 executions, %d sibling rows, oldest %d", res, 2*fftest.SiblingRowsEach, cutoff-3000)
	}
	if exists("Oldest") || exists("Older") || !exists("Cancelled") || !exists("AtTheCutoff") {
		t.Fatalf("first batch deleted the wrong executions")
	}
	res, err = store.TrimExecutions(ctx, pool, p, cutoff, 100, store.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Executions != 2 {
		t.Fatalf("second batch = %+v; want the cancelled execution and the one at the cutoff", res)
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			got := fftest.SiblingRows(t, pool, r.exec.Partition, ids[r.name])
			want := allSiblings(0)
			if !r.due {
				want = allSiblings(1)
			}
			if exists(r.name) == r.due {
				t.Errorf("execution exists = %v; want %v", !r.due, !r.due)
			}
			if !maps.Equal(got, want) {
				t.Errorf("sibling rows = %v; want %v", got, want)
			}
		})
	}
	// Run twice: nothing more.
	if res, err := store.TrimExecutions(ctx, pool, p, cutoff, 100, store.Filter{}); err != nil || res != (store.TrimResult{}) {
		t.Fatalf("a third trim = %+v, %v; want nothing deleted", res, err)
	}
}

// TestTrimExecutionsTenantFilter: a filtered trim deletes only its tenant's
// executions (namespace, instance tag), and none of another tenant's sibling
// rows, though they share the partition. A regression deletes the other
// tenant's history.
func TestTrimExecutionsTenantFilter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t).Pool
	const cutoff, p = int64(1_700_000_000_000), int16(3)
	insert := func(ns string, tags map[string]string) string {
		e := fftest.Terminal(p, cutoff-1000)
		e.Namespace, e.Tags = ns, tags
		id := fftest.InsertExec(t, pool, e)
		fftest.InsertSiblings(t, pool, p, id, fftest.NewUUID())
		return id
	}
	acme := insert("acme", map[string]string{"cairn.instance_id": "a1"})
	acmeOtherTag := insert("acme", map[string]string{"cairn.instance_id": "a2"})
	beta := insert("beta", nil)

	res, err := store.TrimExecutions(ctx, pool, p, cutoff, 100,
		store.Filter{Namespace: "acme", TagKey: "cairn.instance_id", TagValue: "a1"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Executions != 1 {
		t.Fatalf("trim = %+v; want acme/a1's one execution", res)
	}
	if got := fftest.SiblingRows(t, pool, p, acme); !maps.Equal(got, allSiblings(0)) {
		t.Errorf("acme/a1's sibling rows = %v; want none", got)
	}
	for _, id := range []string{acmeOtherTag, beta} {
		if got := fftest.SiblingRows(t, pool, p, id); !maps.Equal(got, allSiblings(1)) {
			t.Errorf("another tenant's sibling rows = %v; want all kept", got)
		}
	}
	if n := fftest.Count(t, pool, `SELECT count(*) FROM ff_exec_core WHERE partition_key = $1`, p); n != 2 {
		t.Errorf("%d executions left; want the other tenants' 2", n)
	}
}

// TestTrimExecutionsRechecksUnderLock: an execution locked by another
// transaction (a replay in progress) is skipped, not waited for, and the
// rest of the batch is trimmed; once the replay has committed the
// execution active again, a later trim leaves it. Proves the trim locks
// each execution and re-checks it on its newest version. A regression
// blocks behind the lock, or deletes the replayed execution's rows.
func TestTrimExecutionsRechecksUnderLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t).Pool
	const cutoff, p = int64(1_700_000_000_000), int16(4)
	replayed := fftest.InsertExec(t, pool, fftest.Terminal(p, cutoff-2000))
	fftest.InsertSiblings(t, pool, p, replayed, fftest.NewUUID())
	plain := fftest.InsertExec(t, pool, fftest.Terminal(p, cutoff-1000))

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := tx.Exec(ctx, `UPDATE ff_exec_core SET lifecycle_phase = 'active', public_state = 'waiting'
		WHERE partition_key = $1 AND execution_id = $2`, p, replayed); err != nil {
		t.Fatal(err)
	}
	res, err := store.TrimExecutions(ctx, pool, p, cutoff, 100, store.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Executions != 1 || res.OldestTerminalMs != cutoff-1000 {
		t.Fatalf("trim beside a locked execution = %+v; want only the unlocked one", res)
	}
	if n := fftest.Count(t, pool, `SELECT count(*) FROM ff_exec_core WHERE partition_key = $1 AND execution_id = $2`, p, plain); n != 0 {
		t.Fatal("the unlocked execution was not trimmed")
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if res, err := store.TrimExecutions(ctx, pool, p, cutoff, 100, store.Filter{}); err != nil || res.Executions != 0 {
		t.Fatalf("trim after the replay = %+v, %v; want nothing deleted", res, err)
	}
	if got := fftest.SiblingRows(t, pool, p, replayed); !maps.Equal(got, allSiblings(1)) {
		t.Errorf("the replayed execution's sibling rows = %v; want all kept", got)
	}
}

// TestTrimLeaseEvents: the oldest lease events before the cutoff are
// deleted, whatever their execution, and never one after the first recent
// event (so what is left is the outbox's newest part); the mark records the
// highest id deleted and only ever rises. A regression deletes a recent
// event, skips over one, or leaves a lease-history consumer unaware of the
// trim.
func TestTrimLeaseEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t).Pool
	const cutoff = int64(1_700_000_000_000)
	insert := func(at int64) int64 {
		var id int64
		if err := pool.QueryRow(ctx, `INSERT INTO ff_lease_event (execution_id, event_type, occurred_at_ms, partition_key)
			VALUES ($1, 'renewed', $2, 5) RETURNING event_id`, fftest.NewUUID(), at).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	if got, err := store.LeaseEventsTrimmedThrough(ctx, pool); err != nil || got != 0 {
		t.Fatalf("mark before any trim = %d, %v; want 0", got, err)
	}
	old1, old2, old3 := insert(cutoff-30), insert(cutoff-20), insert(cutoff-10)
	recent := insert(cutoff)
	oldAfterRecent := insert(cutoff - 50) // a writer with a slow clock
	_ = recent

	res, err := store.TrimLeaseEvents(ctx, pool, cutoff, 2)
	if err != nil {
		t.Fatal(err)
	}
	if res.Deleted != 2 || res.Through != old2 || res.OldestMs != cutoff-30 {
		t.Fatalf("first batch = %+v; want 2 deleted through %d", res, old2)
	}
	res, err = store.TrimLeaseEvents(ctx, pool, cutoff, 100)
	if err != nil {
		t.Fatal(err)
	}
	if res.Deleted != 1 || res.Through != old3 {
		t.Fatalf("second batch = %+v; want only %d, stopping at the recent event", res, old3)
	}
	left := fftest.Count(t, pool, `SELECT count(*) FROM ff_lease_event WHERE event_id IN ($1, $2, $3)`, old1, old2, old3)
	if left != 0 || fftest.Count(t, pool, `SELECT count(*) FROM ff_lease_event`) != 2 {
		t.Fatalf("events left wrong: the recent one and the one after it must stay")
	}
	if got, err := store.LeaseEventsTrimmedThrough(ctx, pool); err != nil || got != old3 {
		t.Fatalf("mark = %d, %v; want %d", got, err, old3)
	}
	// A later cutoff passes the recent event and the one after it.
	res, err = store.TrimLeaseEvents(ctx, pool, cutoff+1, 100)
	if err != nil || res.Deleted != 2 || res.Through != oldAfterRecent {
		t.Fatalf("trim past the recent event = %+v, %v; want 2 through %d", res, err, oldAfterRecent)
	}
	if res, err := store.TrimLeaseEvents(ctx, pool, cutoff+1, 100); err != nil || res.Deleted != 0 {
		t.Fatalf("a trim of an empty outbox = %+v, %v", res, err)
	}
	if got, _ := store.LeaseEventsTrimmedThrough(ctx, pool); got != oldAfterRecent {
		t.Fatalf("mark after an empty trim = %d; want it kept at %d", got, oldAfterRecent)
	}
}

// TestTrimCompletionEvents: dispatched completion events committed before
// the cutoff are deleted; an undispatched one is kept however old, and does
// not stop the trim of dispatched ones after it. A regression deletes an
// event the dispatcher still owes, or stalls behind it.
func TestTrimCompletionEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t).Pool
	const cutoff = int64(1_700_000_000_000)
	insert := func(p int16, committed int64, dispatched bool) string {
		id := fftest.NewUUID()
		var d *int64
		if dispatched {
			d = fftest.Ms(committed + 1)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO ff_completion_event (partition_key, execution_id, outcome, occurred_at_ms, committed_at_ms, dispatched_at_ms)
			VALUES ($1, $2, 'success', $3, $3, $4)`, p, id, committed, d); err != nil {
			t.Fatal(err)
		}
		return id
	}
	undispatched := insert(1, cutoff-100, false)
	oldA := insert(2, cutoff-90, true)
	oldB := insert(200, cutoff-80, true)
	recent := insert(3, cutoff, true)

	res, err := store.TrimCompletionEvents(ctx, pool, cutoff, 100)
	if err != nil {
		t.Fatal(err)
	}
	if res.Deleted != 2 {
		t.Fatalf("trim = %+v; want the two old dispatched events", res)
	}
	for id, want := range map[string]int{undispatched: 1, oldA: 0, oldB: 0, recent: 1} {
		if n := fftest.Count(t, pool, `SELECT count(*) FROM ff_completion_event WHERE execution_id = $1`, id); n != want {
			t.Errorf("event of %s: %d rows; want %d", id, n, want)
		}
	}
	if res, err := store.TrimCompletionEvents(ctx, pool, cutoff, 100); err != nil || res.Deleted != 0 {
		t.Fatalf("second trim = %+v, %v; want nothing", res, err)
	}
}
