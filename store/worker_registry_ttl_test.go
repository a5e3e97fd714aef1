package store_test

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
)

// insertRegistryEvent inserts an ff_worker_registry_event row.
func insertRegistryEvent(t *testing.T, db store.DB, p int16, namespace, instanceID, kind string, atMs int64, reason *string) {
	t.Helper()
	if _, err := db.Exec(context.Background(), `
		INSERT INTO ff_worker_registry_event (partition_key, namespace, worker_instance_id, event_kind, event_at_ms, reason)
		VALUES ($1, $2, $3, $4, $5, $6)`, p, namespace, instanceID, kind, atMs, reason); err != nil {
		t.Fatalf("insert ff_worker_registry_event: %v", err)
	}
}

// registryEvents is fftest.WorkerEvents in a total order (events of one
// registration in several partitions may share a time and kind).
func registryEvents(t *testing.T, db store.DB, namespace, instanceID string) []fftest.WorkerEvent {
	t.Helper()
	evs := fftest.WorkerEvents(t, db, namespace, instanceID)
	slices.SortFunc(evs, func(a, b fftest.WorkerEvent) int {
		return cmp.Or(cmp.Compare(a.AtMs, b.AtMs), cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Partition, b.Partition))
	})
	return evs
}

// registryPartitionState is every registration and event of a registry
// partition, without the partition key, as text.
func registryPartitionState(t *testing.T, db store.DB, p int16) string {
	t.Helper()
	var workers, events string
	if err := db.QueryRow(context.Background(), `
		SELECT COALESCE((SELECT jsonb_agg(to_jsonb(w) - 'partition_key' ORDER BY w.namespace, w.worker_instance_id)
		                   FROM ff_worker_registry w WHERE w.partition_key = $1), '[]')::text,
		       COALESCE((SELECT jsonb_agg(to_jsonb(e) - 'partition_key'
		                          ORDER BY e.namespace, e.worker_instance_id, e.event_at_ms, e.event_kind)
		                   FROM ff_worker_registry_event e WHERE e.partition_key = $1), '[]')::text`, p).Scan(&workers, &events); err != nil {
		t.Fatal(err)
	}
	return "workers " + workers + "\nevents " + events
}

// sweepOne sweeps one registration and fails the test on an error.
func sweepOne(t *testing.T, db store.DB, p int16, namespace, instanceID string, now int64) store.WorkerSweepResult {
	t.Helper()
	res, err := store.SweepWorkers(context.Background(), db, p, []store.WorkerRef{{namespace, instanceID}}, now)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 {
		t.Fatalf("%d results for one registration", len(res))
	}
	return res[0]
}

// TestSweepWorkersStaleness: a registration is swept exactly when
// last_heartbeat_ms + liveness_ttl_ms < now (strictly), with its own TTL, in
// any namespace: it is deleted and gets one ttl_swept event carrying its
// partition, namespace and instance id, at now, with a NULL reason. One at
// the boundary (sum == now), within its TTL, or with an old heartbeat but a
// long TTL stays, without an event. A sum beyond the bigint range is never
// stale and fails nothing (ours: FlowFabric's sweep raises "bigint out of
// range" for the whole partition); one below it is stale. The partition's
// due scan returns exactly the stale ones, and a second sweep is a no-op. A
// regression shows as `<=`, a global TTL, an error on the overflowing row,
// an event with the wrong key or reason, a second event, or a DeadlineMs
// other than the sum clamped to the bigint range.
func TestSweepWorkersStaleness(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t).Pool
	const now, p = int64(1_700_000_000_000), int16(17)

	tests := []struct {
		name           string
		heartbeat, ttl int64
		stale          bool
		// lapsed is a stale one's DeadlineMs: heartbeat + ttl, clamped to
		// the bigint range (written out: the Go sum would wrap).
		lapsed int64
	}{
		{name: "OneMsPastItsTTL", heartbeat: now - 30_001, ttl: 30_000, stale: true, lapsed: now - 1},
		{name: "ExactlyAtItsTTL", heartbeat: now - 30_000, ttl: 30_000},
		{name: "WithinItsTTL", heartbeat: now - 29_999, ttl: 30_000},
		{name: "OldHeartbeatLongTTL", heartbeat: now - 3_600_000, ttl: 7_200_000},
		{name: "RecentHeartbeatShortTTL", heartbeat: now - 10, ttl: 5, stale: true, lapsed: now - 5},
		{name: "NegativeTTL", heartbeat: now, ttl: -1, stale: true, lapsed: now - 1},
		{name: "HeartbeatInTheFuture", heartbeat: now + 60_000, ttl: 1},
		{name: "SumAboveBigint", heartbeat: math.MaxInt64 - 5, ttl: 30_000},
		{name: "SumBelowBigint", heartbeat: math.MinInt64 + 5, ttl: -30_000, stale: true, lapsed: math.MinInt64},
	}
	// All in one partition, each in its own namespace.
	ids := make([]string, len(tests))
	var wantScan []string
	for i, tt := range tests {
		ids[i] = fftest.InsertWorker(t, pool, fftest.Worker{Partition: p, Namespace: "ns-" + tt.name,
			LastHeartbeatMs: tt.heartbeat, TTLMs: tt.ttl})
		if tt.stale {
			wantScan = append(wantScan, "ns-"+tt.name+"/"+ids[i])
		}
	}
	scanned, err := store.StaleWorkers.Scan(ctx, pool, p, now, nil, 100, store.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	var gotScan []string
	for _, r := range scanned {
		gotScan = append(gotScan, r.ID+"/"+r.ID2)
	}
	slices.Sort(gotScan)
	slices.Sort(wantScan)
	if !slices.Equal(gotScan, wantScan) {
		t.Fatalf("due scan = %v; want %v", gotScan, wantScan)
	}

	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns, id := "ns-"+tt.name, ids[i]
			res := sweepOne(t, pool, p, ns, id, now)
			if want := (store.WorkerSweepResult{Swept: tt.stale, EventWritten: tt.stale, DeadlineMs: tt.lapsed}); res != want {
				t.Fatalf("result = %+v; want %+v", res, want)
			}
			if exists := fftest.WorkerExists(t, pool, p, ns, id); exists == tt.stale {
				t.Fatalf("registration exists = %v; want %v", exists, !tt.stale)
			}
			var want []fftest.WorkerEvent
			if tt.stale {
				want = []fftest.WorkerEvent{{Kind: "ttl_swept", AtMs: now, Partition: p}}
			}
			if evs := registryEvents(t, pool, ns, id); !reflect.DeepEqual(evs, want) && len(evs)+len(want) > 0 {
				t.Fatalf("events = %+v; want %+v", evs, want)
			}

			// A second sweep (the job ran twice) changes nothing.
			state := registryPartitionState(t, pool, p)
			if res := sweepOne(t, pool, p, ns, id, now); res != (store.WorkerSweepResult{}) {
				t.Fatalf("second sweep = %+v; want a no-op", res)
			}
			if got := registryPartitionState(t, pool, p); got != state {
				t.Fatalf("a second sweep changed the partition:\n got %s\nwant %s", got, state)
			}
		})
	}
}

// TestSweepWorkersEventKey: the ttl_swept event's key is (partition,
// namespace, instance, event_at_ms, event_kind). When an event of that key
// exists already, the registration is still deleted, no event is added
// (EventWritten false: FlowFabric's ON CONFLICT DO NOTHING) and the old one
// is kept as it was. Events of other kinds at the same millisecond, a
// ttl_swept event at another millisecond, or one of the same key in another
// partition do not conflict, and stay. A regression shows as the sweep
// failing or keeping the row on a conflict, an event overwritten, an
// existing event deleted, or a DeadlineMs other than the seeded heartbeat
// + TTL.
func TestSweepWorkersEventKey(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t).Pool
	const now, p = int64(1_700_000_000_000), int16(23)

	type event struct {
		partition int16
		kind      string
		at        int64
		reason    *string
	}
	tests := []struct {
		name    string
		events  []event
		written bool
	}{
		{name: "SameKeyExists", events: []event{{p, "ttl_swept", now, fftest.Str("earlier")}}},
		{name: "OtherKindsAtTheSameMs", events: []event{{p, "registered", now, nil}, {p, "marked_dead", now, fftest.Str("x")}}, written: true},
		{name: "TTLSweptAtAnotherMs", events: []event{{p, "ttl_swept", now - 1, nil}, {p, "ttl_swept", now + 1, nil}}, written: true},
		{name: "SameKeyInAnotherPartition", events: []event{{p + 1, "ttl_swept", now, fftest.Str("elsewhere")}}, written: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns := "ns-" + tt.name
			id := fftest.InsertWorker(t, pool, fftest.Worker{Partition: p, Namespace: ns, LastHeartbeatMs: now - 60_000, TTLMs: 1_000})
			for _, e := range tt.events {
				insertRegistryEvent(t, pool, e.partition, ns, id, e.kind, e.at, e.reason)
			}
			before := registryEvents(t, pool, ns, id)

			res := sweepOne(t, pool, p, ns, id, now)
			// Swept whether or not the event is written: DeadlineMs is the
			// seeded heartbeat + TTL all the same.
			if want := (store.WorkerSweepResult{Swept: true, EventWritten: tt.written, DeadlineMs: now - 60_000 + 1_000}); res != want {
				t.Fatalf("result = %+v; want %+v", res, want)
			}
			if fftest.WorkerExists(t, pool, p, ns, id) {
				t.Fatal("registration not deleted")
			}
			want := slices.Clone(before)
			if tt.written {
				want = append(want, fftest.WorkerEvent{Kind: "ttl_swept", AtMs: now, Partition: p})
				slices.SortFunc(want, func(a, b fftest.WorkerEvent) int {
					return cmp.Or(cmp.Compare(a.AtMs, b.AtMs), cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Partition, b.Partition))
				})
			}
			if got := registryEvents(t, pool, ns, id); !reflect.DeepEqual(got, want) {
				t.Fatalf("events = %+v; want %+v", got, want)
			}
		})
	}
}

// TestSweepWorkersRechecksUnderLock proves the staleness is re-checked under
// the row lock: a transaction holding the registration when the sweep
// starts, and committing while the sweep waits on the lock, decides. A
// heartbeat or a longer TTL keeps the row (no event); a mark_worker_dead
// that deleted it first leaves the sweep nothing to do (only its own event);
// a change that keeps the row stale (another worker id) does not save it. A
// regression shows as a worker swept right after its heartbeat, a second
// event for a dead worker, a stale row left because it changed, or a
// DeadlineMs other than the locked row's heartbeat + TTL.
func TestSweepWorkersRechecksUnderLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t).Pool
	const now, p = int64(1_700_000_000_000), int16(31)
	const where = ` WHERE partition_key = $1 AND namespace = $2 AND worker_instance_id = $3`

	tests := []struct {
		name string
		// change runs in the concurrent transaction ($1 partition, $2
		// namespace, $3 instance id, $4 now).
		change []string
		want   store.WorkerSweepResult
		exists bool
		events []string // kinds, in order
	}{
		{name: "Heartbeat", change: []string{`UPDATE ff_worker_registry SET last_heartbeat_ms = $4` + where}, exists: true},
		{name: "LongerTTL", change: []string{`UPDATE ff_worker_registry SET liveness_ttl_ms = $4::bigint - last_heartbeat_ms + 3600000` + where}, exists: true},
		{name: "MarkedDead", change: []string{
			`DELETE FROM ff_worker_registry` + where + ` AND $4::bigint IS NOT NULL`,
			`INSERT INTO ff_worker_registry_event (partition_key, namespace, worker_instance_id, event_kind, event_at_ms, reason)
			 VALUES ($1, $2, $3, 'marked_dead', $4, 'operator')`,
		}, events: []string{"marked_dead"}},
		{name: "StillStale", change: []string{`UPDATE ff_worker_registry SET worker_id = 'worker-2', registered_at_ms = $4` + where},
			// Heartbeat and TTL as seeded: lapsed at now - 60_000 + 30_000.
			want: store.WorkerSweepResult{Swept: true, EventWritten: true, DeadlineMs: now - 30_000}, events: []string{"ttl_swept"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns := "ns-" + tt.name
			id := fftest.InsertWorker(t, pool, fftest.Worker{Partition: p, Namespace: ns, LastHeartbeatMs: now - 60_000, TTLMs: 30_000})
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx) //nolint:errcheck
			for _, sql := range tt.change {
				if _, err := tx.Exec(ctx, sql, p, ns, id, now); err != nil {
					t.Fatal(err)
				}
			}
			type out struct {
				res store.WorkerSweepResult
				err error
			}
			done := make(chan out, 1)
			go func() {
				res, err := store.SweepWorkers(ctx, pool, p, []store.WorkerRef{{ns, id}}, now)
				o := out{err: err}
				if err == nil && len(res) == 1 {
					o.res = res[0]
				} else if err == nil {
					o.err = fmt.Errorf("%d results for one registration", len(res))
				}
				done <- o
			}()
			waitForLockWait(t, pool, "ff_worker_registry")
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case o := <-done:
				if o.err != nil {
					t.Fatal(o.err)
				}
				if o.res != tt.want {
					t.Fatalf("result = %+v; want %+v", o.res, tt.want)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("sweep did not finish")
			}
			if exists := fftest.WorkerExists(t, pool, p, ns, id); exists != tt.exists {
				t.Fatalf("registration exists = %v; want %v", exists, tt.exists)
			}
			var kinds []string
			for _, e := range registryEvents(t, pool, ns, id) {
				kinds = append(kinds, e.Kind)
			}
			if !slices.Equal(kinds, tt.events) {
				t.Fatalf("events = %v; want %v", kinds, tt.events)
			}
		})
	}
}

// TestSweepWorkersBatch: a batch gives each registration the result it gets
// alone, in input order, and leaves the partition as one call per
// registration does: the same registry is seeded in two partitions, swept
// as one batch in the first and ref by ref in the second. It holds stale
// registrations in two namespaces, a fresh one, a missing one, one at the
// boundary, one whose sum overflows, one whose event key is taken, one
// whose instance id is also registered, fresh, in another namespace, and
// repeated refs (no-ops the second time). A regression shows as results out
// of order, a ref matched across namespaces, the overflowing row failing
// the batch, or a registration given another's DeadlineMs.
func TestSweepWorkersBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t).Pool
	const now, batchP, aloneP = int64(1_700_000_000_000), int16(41), int16(42)

	seed := func(p int16) {
		add := func(ns, id string, heartbeat, ttl int64) {
			fftest.InsertWorker(t, pool, fftest.Worker{Partition: p, Namespace: ns, InstanceID: id, LastHeartbeatMs: heartbeat, TTLMs: ttl})
		}
		add("ns-a", "stale-a", now-31_000, 30_000)
		add("ns-a", "fresh", now-1_000, 30_000)
		add("ns-b", "stale-b", now-5, 4)
		add("ns-a", "boundary", now-30_000, 30_000)
		add("ns-a", "overflow", math.MaxInt64-1, 30_000)
		add("ns-a", "taken", now-100_000, 30_000)
		insertRegistryEvent(t, pool, p, "ns-a", "taken", "ttl_swept", now, fftest.Str("earlier"))
		add("ns-a", "shared", now-100_000, 30_000)
		add("ns-b", "shared", now, 30_000)
	}
	seed(batchP)
	seed(aloneP)

	refs := []store.WorkerRef{
		{"ns-a", "fresh"}, {"ns-a", "stale-a"}, {"ns-a", "missing"}, {"ns-b", "stale-b"}, {"ns-a", "boundary"},
		{"ns-a", "overflow"}, {"ns-a", "taken"}, {"ns-a", "stale-a"}, {"ns-b", "shared"}, {"ns-a", "shared"}, {"ns-b", "stale-a"},
	}
	got, err := store.SweepWorkers(ctx, pool, batchP, refs, now)
	if err != nil {
		t.Fatal(err)
	}
	// swept is a swept registration with its event, lapsed at its seeded
	// heartbeat + TTL.
	swept := func(lapsed int64) store.WorkerSweepResult {
		return store.WorkerSweepResult{Swept: true, EventWritten: true, DeadlineMs: lapsed}
	}
	want := []store.WorkerSweepResult{
		{}, swept(now - 31_000 + 30_000), {}, swept(now - 5 + 4), {},
		{}, {Swept: true, DeadlineMs: now - 100_000 + 30_000}, {}, {}, swept(now - 100_000 + 30_000), {},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("batch results:\n got %+v\nwant %+v", got, want)
	}
	var alone []store.WorkerSweepResult
	for _, r := range refs {
		alone = append(alone, sweepOne(t, pool, aloneP, r.Namespace, r.WorkerInstanceID, now))
	}
	if !reflect.DeepEqual(got, alone) {
		t.Fatalf("batch results differ from one call per registration:\n batch %+v\n alone %+v", got, alone)
	}
	if b, a := registryPartitionState(t, pool, batchP), registryPartitionState(t, pool, aloneP); b != a {
		t.Fatalf("the batch left its partition unlike one call per registration:\n batch %s\n alone %s", b, a)
	}
	if !fftest.WorkerExists(t, pool, batchP, "ns-b", "shared") || fftest.WorkerExists(t, pool, batchP, "ns-a", "shared") {
		t.Fatal("the shared instance id was swept in the wrong namespace")
	}
}

// TestStaleWorkersOverflowingSum: the due rows' deadline is the heartbeat
// plus the TTL taken in numeric and capped to the bigint range, so a
// registration whose sum overflows bigint (a heartbeat near the largest
// bigint, a positive TTL) neither fails nor appears in a scan, a probe of the
// partitions or a count, while a stale row beside it does; a sum below the
// bigint range is stale, reported at the smallest bigint, and found by a
// probe without a lower bound. SweepWorkers agrees with the scan on each of
// them. A regression shows as "bigint out of range" from a query of the due
// rows (FlowFabric's fate for the whole partition), the overflowing row
// reported stale, the underflowing one missed, or a sweep's DeadlineMs
// other than the scan's deadline.
func TestStaleWorkersOverflowingSum(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t).Pool
	const now = int64(1_700_000_000_000)
	const mixed, overflowOnly, underflow, boundaryOnly = int16(60), int16(61), int16(62), int16(63)

	overflow := fftest.InsertWorker(t, pool, fftest.Worker{Partition: mixed, LastHeartbeatMs: math.MaxInt64 - 1_000, TTLMs: 30_000})
	stale := fftest.InsertWorker(t, pool, fftest.Worker{Partition: mixed, Namespace: "other", LastHeartbeatMs: now - 31_000, TTLMs: 30_000})
	fftest.InsertWorker(t, pool, fftest.Worker{Partition: mixed, LastHeartbeatMs: now, TTLMs: 30_000})
	fftest.InsertWorker(t, pool, fftest.Worker{Partition: overflowOnly, LastHeartbeatMs: math.MaxInt64, TTLMs: math.MaxInt64})
	negative := fftest.InsertWorker(t, pool, fftest.Worker{Partition: underflow, LastHeartbeatMs: math.MinInt64 + 1, TTLMs: -30_000})
	fftest.InsertWorker(t, pool, fftest.Worker{Partition: boundaryOnly, LastHeartbeatMs: now - 30_000, TTLMs: 30_000})

	tests := []struct {
		partition int16
		want      []store.DueRow
	}{
		{mixed, []store.DueRow{{AtMs: now - 1_000, ID: "other", ID2: stale}}},
		{overflowOnly, nil},
		{underflow, []store.DueRow{{AtMs: math.MinInt64, ID: "default", ID2: negative}}},
		{boundaryOnly, nil},
	}
	for _, tt := range tests {
		got, err := store.StaleWorkers.Scan(ctx, pool, tt.partition, now, nil, 10, store.Filter{})
		if err != nil {
			t.Fatalf("scan of partition %d: %v", tt.partition, err)
		}
		if !reflect.DeepEqual(got, tt.want) && len(got)+len(tt.want) > 0 {
			t.Fatalf("scan of partition %d = %+v; want %+v", tt.partition, got, tt.want)
		}
	}
	// Scanning on from the stale row does not trip over the overflowing one.
	if got, err := store.StaleWorkers.Scan(ctx, pool, mixed, now, &tests[0].want[0], 10, store.Filter{}); err != nil || len(got) != 0 {
		t.Fatalf("scan after the stale row = %+v, %v; want nothing", got, err)
	}

	parts, err := store.StaleWorkers.Partitions(ctx, pool, store.NoLowerBound, now, 256, store.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if want := []int16{mixed, underflow}; !slices.Equal(parts, want) {
		t.Fatalf("partitions = %v; want %v", parts, want)
	}
	// Far in the future every row is stale but the overflowing ones.
	parts, err = store.StaleWorkers.Partitions(ctx, pool, store.NoLowerBound, math.MaxInt64, 256, store.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if want := []int16{mixed, underflow, boundaryOnly}; !slices.Equal(parts, want) {
		t.Fatalf("partitions at the largest bigint = %v; want %v", parts, want)
	}
	count, err := store.StaleWorkers.Count(ctx, pool, now, store.Filter{}, 100)
	if err != nil || count.Due != 2 {
		t.Fatalf("count = %+v, %v; want 2 due", count, err)
	}

	// The sweep agrees, and the overflowing row fails nothing.
	res, err := store.SweepWorkers(ctx, pool, mixed, []store.WorkerRef{{"default", overflow}, {"other", stale}}, now)
	if err != nil {
		t.Fatal(err)
	}
	// The stale row's DeadlineMs is its scanned deadline, now - 1_000.
	if want := []store.WorkerSweepResult{{}, {Swept: true, EventWritten: true, DeadlineMs: now - 1_000}}; !reflect.DeepEqual(res, want) {
		t.Fatalf("sweep = %+v; want %+v", res, want)
	}
	// Its sum is below the bigint range: DeadlineMs is clamped, as the scan
	// reports it.
	if r := sweepOne(t, pool, underflow, "default", negative, now); r != (store.WorkerSweepResult{Swept: true, EventWritten: true,
		DeadlineMs: math.MinInt64}) {
		t.Fatalf("sweep of the underflowing row = %+v; want swept", r)
	}
	if !fftest.WorkerExists(t, pool, mixed, "default", overflow) {
		t.Fatal("the overflowing row was swept")
	}
}
