package leasehistory_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/internal/testlog"
	"github.com/flowfabric/ffreconcile/leasehistory"
)

// quiet keeps expected warnings (skipped rows, reconnects) out of test output.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// insertEvent inserts one lease event and returns its id. ns and tag are
// nil (NULL) or strings.
func insertEvent(t *testing.T, ctx context.Context, q querier, partition int, typ string, ns, tag any) int64 {
	t.Helper()
	var id int64
	err := q.QueryRow(ctx, `
INSERT INTO ff_lease_event (execution_id, event_type, occurred_at_ms, partition_key, namespace, instance_tag)
VALUES (gen_random_uuid()::text, $1, (extract(epoch FROM now()) * 1000)::bigint, $2, $3, $4)
RETURNING event_id`, typ, partition, ns, tag).Scan(&id)
	if err != nil {
		t.Fatalf("insert lease event: %v", err)
	}
	return id
}

func subscribe(t *testing.T, ctx context.Context, pool *pgxpool.Pool, opts leasehistory.Options) *leasehistory.Subscription {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	sub, err := leasehistory.Subscribe(ctx, pool, opts)
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

// next returns the next lease event, skipping disconnect notices.
func next(t *testing.T, sub *leasehistory.Subscription) leasehistory.Event {
	t.Helper()
	deadline := time.After(15 * time.Second)
	for {
		select {
		case ev, ok := <-sub.Events():
			if !ok {
				t.Fatalf("subscription ended: %v", sub.Err())
			}
			if ev.Type == leasehistory.EventDisconnected {
				continue
			}
			return ev
		case <-deadline:
			t.Fatal("no event within 15s")
		}
	}
}

// drain collects a bounded read's events until the subscription ends.
func drain(t *testing.T, sub *leasehistory.Subscription) []leasehistory.Event {
	t.Helper()
	var evs []leasehistory.Event
	deadline := time.After(15 * time.Second)
	for {
		select {
		case ev, ok := <-sub.Events():
			if !ok {
				if err := sub.Err(); err != nil {
					t.Fatalf("bounded read failed: %v", err)
				}
				return evs
			}
			evs = append(evs, ev)
		case <-deadline:
			t.Fatal("bounded read did not end within 15s")
		}
	}
}

func ids(evs []leasehistory.Event) []int64 {
	out := make([]int64, len(evs))
	for i, ev := range evs {
		out[i] = ev.EventID
	}
	return out
}

// testCtx bounds a test's reads to a minute. Take it after the test's
// database: creating one can take most of a minute on a loaded machine.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// modes runs a test over LISTEN and polling subscriptions.
var modes = []struct {
	name string
	opts leasehistory.Options
}{
	{"listen", leasehistory.Options{}},
	{"poll", leasehistory.Options{Poll: true, PollInterval: 50 * time.Millisecond}},
}

func TestTailFromNow(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			ctx := testCtx(t)
			for range 3 {
				insertEvent(t, ctx, db.Pool, 1, "acquired", nil, nil)
			}
			sub := subscribe(t, ctx, db.Pool, m.opts)
			a := insertEvent(t, ctx, db.Pool, 2, "renewed", "ns", "i-1")
			b := insertEvent(t, ctx, db.Pool, 3, "expired", nil, nil)

			ev := next(t, sub)
			if ev.EventID != a || ev.Type != leasehistory.EventRenewed || ev.Partition != 2 ||
				!strings.HasPrefix(ev.ExecutionID, "{fp:2}:") || ev.Namespace != "ns" || ev.InstanceTag != "i-1" ||
				ev.OccurredAt.IsZero() || ev.Cursor.String() != leasehistory.EncodeCursor(a).String() {
				t.Fatalf("first event %+v; want event %d (events before Subscribe must not be delivered)", ev, a)
			}
			if ev := next(t, sub); ev.EventID != b {
				t.Fatalf("second event %d; want %d", ev.EventID, b)
			}
		})
	}
}

func TestResumeAfterCursor(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := testCtx(t)
	for range 5 {
		insertEvent(t, ctx, db.Pool, 0, "acquired", nil, nil)
	}
	sub := subscribe(t, ctx, db.Pool, leasehistory.Options{Cursor: leasehistory.EncodeCursor(0)})
	var saved leasehistory.Cursor
	for want := int64(1); want <= 3; want++ {
		ev := next(t, sub)
		if ev.EventID != want {
			t.Fatalf("event %d; want %d", ev.EventID, want)
		}
		saved = ev.Cursor
	}
	if err := sub.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	// Resume from the saved text form, as a user would.
	cursor, err := leasehistory.ParseCursor(saved.String())
	if err != nil {
		t.Fatal(err)
	}
	sub = subscribe(t, ctx, db.Pool, leasehistory.Options{Cursor: cursor})
	insertEvent(t, ctx, db.Pool, 0, "renewed", nil, nil)
	insertEvent(t, ctx, db.Pool, 0, "renewed", nil, nil)
	var got []int64
	for range 4 {
		got = append(got, next(t, sub).EventID)
	}
	if want := []int64{4, 5, 6, 7}; !slices.Equal(got, want) {
		t.Fatalf("after resume got %v; want %v", got, want)
	}
}

func TestSubscribeRefusesBadOptions(t *testing.T) {
	t.Parallel()
	// The pool is never used: options are checked before any query.
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	tests := []struct {
		name    string
		opts    leasehistory.Options
		wantMsg string
	}{
		{"wrong prefix", leasehistory.Options{Cursor: leasehistory.Cursor{1, 0, 0, 0, 0, 0, 0, 0, 1}}, "prefix byte 0x01, want 0x02"},
		{"wrong length", leasehistory.Options{Cursor: leasehistory.Cursor{2, 0, 1}}, "3 bytes, want 9"},
		{"negative id", leasehistory.Options{Cursor: leasehistory.Cursor{2, 0x80, 0, 0, 0, 0, 0, 0, 0}}, "negative event id"},
		{"partition out of range", leasehistory.Options{Partitions: []int{256}}, "partition 256 out of range 0..255"},
		{"negative duration", leasehistory.Options{Cursor: leasehistory.EncodeCursor(0), GapWait: -1}, "negative duration"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sub, err := leasehistory.Subscribe(context.Background(), pool, tt.opts)
			if err == nil {
				sub.Close()
				t.Fatal("Subscribe accepted the options")
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Fatalf("error %q does not mention %q", err, tt.wantMsg)
			}
			if strings.Contains(tt.name, "prefix") && !errors.Is(err, leasehistory.ErrMalformedCursor) {
				t.Fatalf("error %v does not wrap ErrMalformedCursor", err)
			}
		})
	}
}

func TestFilters(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := testCtx(t)
	// id: partition, namespace, tag
	rows := []struct {
		part    int
		ns, tag any
	}{
		{1, "a", "i-1"}, // 1
		{1, nil, nil},   // 2
		{2, "a", nil},   // 3
		{5, "b", "i-1"}, // 4
		{7, "a", "i-2"}, // 5
		{5, nil, "i-1"}, // 6
		{9, "b", nil},   // 7: filtered out by every filter below but "none"
	}
	for _, r := range rows {
		insertEvent(t, ctx, db.Pool, r.part, "acquired", r.ns, r.tag)
	}
	tests := []struct {
		name string
		opts leasehistory.Options
		want []int64
	}{
		{"none", leasehistory.Options{}, []int64{1, 2, 3, 4, 5, 6, 7}},
		{"namespace", leasehistory.Options{Namespace: "a"}, []int64{1, 3, 5}},
		{"instance tag value", leasehistory.Options{InstanceTag: "i-1"}, []int64{1, 4, 6}},
		{"namespace and tag", leasehistory.Options{Namespace: "a", InstanceTag: "i-1"}, []int64{1}},
		{"one partition", leasehistory.Options{Partitions: []int{5}}, []int64{4, 6}},
		{"several partitions", leasehistory.Options{Partitions: []int{1, 2, 7}}, []int64{1, 2, 3, 5}},
		{"partitions and namespace", leasehistory.Options{Partitions: []int{1, 2}, Namespace: "a"}, []int64{1, 3}},
		{"nothing matches", leasehistory.Options{Namespace: "zzz"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := tt.opts
			opts.Cursor = leasehistory.EncodeCursor(0)
			opts.StopWhenCaughtUp = true
			sub := subscribe(t, ctx, db.Pool, opts)
			if got := ids(drain(t, sub)); !slices.Equal(got, tt.want) {
				t.Fatalf("got %v; want %v", got, tt.want)
			}
			// The position moved past the filtered tail.
			if c := sub.Cursor(); c.String() != leasehistory.EncodeCursor(7).String() {
				t.Fatalf("final cursor %s; want the cursor of event 7", c)
			}
		})
	}
}

// A following, filtered subscriber advances past rows it does not deliver.
func TestFilteredCursorAdvancesWhileFollowing(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := testCtx(t)
	sub := subscribe(t, ctx, db.Pool, leasehistory.Options{Namespace: "a", Partitions: []int{3}})
	want := insertEvent(t, ctx, db.Pool, 3, "acquired", "a", nil)
	if ev := next(t, sub); ev.EventID != want {
		t.Fatalf("event %d; want %d", ev.EventID, want)
	}
	var last int64
	for _, r := range []struct {
		part int
		ns   any
	}{{3, "b"}, {3, nil}, {4, "a"}} {
		last = insertEvent(t, ctx, db.Pool, r.part, "renewed", r.ns, nil)
	}
	waitCursor(t, sub, last)
}

// waitCursor waits for the subscription's position to reach id. The position
// is updated just after an event is handed over, so it may lag the receive.
func waitCursor(t *testing.T, sub *leasehistory.Subscription, id int64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		got, _ := sub.Cursor().EventID()
		if got == id {
			return
		}
		if got > id || time.Now().After(deadline) {
			t.Fatalf("cursor at %d; want %d", got, id)
		}
	}
}

// vxidOf returns tx's virtual transaction id, as pg_locks and the reader's
// running-transaction lists show it.
func vxidOf(t *testing.T, ctx context.Context, tx pgx.Tx) string {
	t.Helper()
	var vxid string
	if err := tx.QueryRow(ctx,
		`SELECT virtualtransaction FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'virtualxid'`).Scan(&vxid); err != nil {
		t.Fatal(err)
	}
	return vxid
}

// holds is a subscription's test signal: the running-transaction lists of
// the holes it stopped at (leasehistory.OnHoldListed).
type holds chan []string

// watchHolds returns opts with the signal set, and the channel it reports on.
func watchHolds(opts leasehistory.Options) (leasehistory.Options, holds) {
	h := make(holds, 100)
	return leasehistory.OnHoldListed(opts, func(vxids []string) {
		select {
		case h <- vxids:
		default: // never more than a few holes per test
		}
	}), h
}

// waitHeldFor waits until sub holds at a hole waiting for the transaction
// vxid, and returns the transactions that hold waits for. An event
// delivered meanwhile fails the test: nothing may pass the hole.
func (h holds) waitHeldFor(t *testing.T, sub *leasehistory.Subscription, vxid string) []string {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		select {
		case vxids := <-h:
			if slices.Contains(vxids, vxid) {
				return vxids
			}
		case ev, ok := <-sub.Events():
			if !ok {
				t.Fatalf("subscription ended: %v", sub.Err())
			}
			if ev.Type != leasehistory.EventDisconnected {
				t.Fatalf("delivered %+v while transaction %s, which holds a lower event id, was open", ev, vxid)
			}
		case <-deadline:
			t.Fatalf("the subscriber never held at a hole waiting for transaction %s", vxid)
		}
	}
}

func TestSkipsUndecodableRows(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := testCtx(t)
	good1 := insertEvent(t, ctx, db.Pool, 1, "acquired", nil, nil)
	insertEvent(t, ctx, db.Pool, 1, "teleported", nil, nil)
	if _, err := db.Pool.Exec(ctx, `INSERT INTO ff_lease_event (execution_id, event_type, occurred_at_ms, partition_key)
VALUES ('{fp:1}:not-a-uuid', 'acquired', 0, 1)`); err != nil {
		t.Fatal(err)
	}
	good2 := insertEvent(t, ctx, db.Pool, 1, "revoked", nil, nil)
	insertEvent(t, ctx, db.Pool, 1, "bogus", nil, nil)

	var logs testlog.Buffer
	sub := subscribe(t, ctx, db.Pool, leasehistory.Options{
		Cursor: leasehistory.EncodeCursor(0), StopWhenCaughtUp: true,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	if got := ids(drain(t, sub)); !slices.Equal(got, []int64{good1, good2}) {
		t.Fatalf("got %v; want %v", got, []int64{good1, good2})
	}
	if id, _ := sub.Cursor().EventID(); id != 5 {
		t.Fatalf("cursor at %d; want 5 (past the skipped rows)", id)
	}
	for _, want := range []string{`unknown event type \"teleported\"`, `not-a-uuid`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
}

// Transaction A takes a lower event id but commits after B: A must still be
// delivered, and before B. In the "A has the higher xid" case A's xid is at or
// above the reader's snapshot xmax, so it is missing from
// pg_snapshot_xip(pg_current_snapshot()); a hole rule based on that list
// would pass the hole after its grace period and lose A.
func TestOutOfOrderCommit(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		for _, aHasHigherXid := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/a_has_higher_xid=%v", m.name, aHasHigherXid), func(t *testing.T) {
				t.Parallel()
				db := testdb.New(t)
				ctx := testCtx(t)
				opts, held := watchHolds(m.opts)
				sub := subscribe(t, ctx, db.Pool, opts)

				txA, err := db.Pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer txA.Rollback(ctx) //nolint:errcheck
				txB, err := db.Pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer txB.Rollback(ctx) //nolint:errcheck
				first, second := pgx.Tx(txA), pgx.Tx(txB)
				if aHasHigherXid {
					first, second = txB, txA
				}
				for _, tx := range []pgx.Tx{first, second} {
					if _, err := tx.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
						t.Fatal(err)
					}
				}
				idA := insertEvent(t, ctx, txA, 1, "acquired", nil, nil)
				idB := insertEvent(t, ctx, txB, 2, "acquired", nil, nil)
				if idA >= idB {
					t.Fatalf("ids %d, %d not in insert order", idA, idB)
				}
				if err := txB.Commit(ctx); err != nil {
					t.Fatal(err)
				}

				// B is committed and visible; the subscriber must hold at A's
				// id, waiting for A's transaction, without delivering B.
				held.waitHeldFor(t, sub, vxidOf(t, ctx, txA))
				if id, _ := sub.Cursor().EventID(); id >= idA {
					t.Fatalf("cursor moved to %d, past the uncommitted event %d", id, idA)
				}

				if err := txA.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				if got := []int64{next(t, sub).EventID, next(t, sub).EventID}; !slices.Equal(got, []int64{idA, idB}) {
					t.Fatalf("got %v; want %v", got, []int64{idA, idB})
				}
			})
		}
	}
}

// A rolled-back insert leaves a permanent hole, passed once its transaction
// has ended, long before the gap wait bound.
func TestRolledBackHoleIsPassed(t *testing.T) {
	t.Parallel()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			ctx := testCtx(t)
			opts := m.opts
			// Far beyond next's wait: an event that arrives was let
			// through by the rollback, not by the bound.
			opts.GapWait = 10 * time.Minute
			opts, held := watchHolds(opts)
			sub := subscribe(t, ctx, db.Pool, opts)

			tx, err := db.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx) //nolint:errcheck
			lost := insertEvent(t, ctx, tx, 1, "acquired", nil, nil)
			kept := insertEvent(t, ctx, db.Pool, 1, "renewed", nil, nil)
			// The subscriber waits at the hole for tx: the rollback, not a
			// late first read, is what lets it pass.
			held.waitHeldFor(t, sub, vxidOf(t, ctx, tx))
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			ev := next(t, sub)
			if ev.EventID != kept {
				t.Fatalf("event %d; want %d (after rolled-back %d)", ev.EventID, kept, lost)
			}
			waitCursor(t, sub, kept)
		})
	}
}

// An unrelated long transaction cannot stall the stream beyond GapWait, and
// once it has outlived the bound later holes do not wait for it again. The
// checks look at which transactions were waited for, not at timing.
func TestGapWaitBound(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := testCtx(t)
	const gapWait = time.Second
	var logs testlog.Buffer
	sub := subscribe(t, ctx, db.Pool, leasehistory.Options{GapWait: gapWait,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})

	idle, err := db.Pool.Begin(ctx) // idle in transaction for the whole test
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Rollback(ctx) //nolint:errcheck
	var idleVxid string
	if err := idle.QueryRow(ctx,
		`SELECT virtualtransaction FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'virtualxid'`).Scan(&idleVxid); err != nil {
		t.Fatal(err)
	}

	rolledBackHole := func() time.Duration {
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		insertEvent(t, ctx, tx, 1, "acquired", nil, nil)
		kept := insertEvent(t, ctx, db.Pool, 1, "renewed", nil, nil)
		start := time.Now()
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if ev := next(t, sub); ev.EventID != kept {
			t.Fatalf("event %d; want %d", ev.EventID, kept)
		}
		return time.Since(start)
	}
	// waitedFor counts bound warnings that list the idle transaction.
	waitedFor := func() int {
		n := 0
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, "gap wait bound") && strings.Contains(line, idleVxid) {
				n++
			}
		}
		return n
	}

	if took := rolledBackHole(); took < gapWait/2 || waitedFor() != 1 {
		t.Fatalf("first hole passed after %v; want it held for the bound by the open transaction %s\n%s",
			took, idleVxid, logs.String())
	}
	rolledBackHole()
	if waitedFor() != 1 {
		t.Fatalf("second hole waited for %s again, which had already outlived the bound\n%s", idleVxid, logs.String())
	}
}

// A transaction of another database cannot write a lease event here, so
// it does not hold a hole: with a bound far beyond next's wait, the hole
// behind a rollback is passed while a transaction with an xid stays open in
// another database. A regression (waiting on the whole server's
// transactions) times out in next, or logs the bound.
func TestOtherDatabasesTransactionsAreIgnored(t *testing.T) {
	t.Parallel()
	db, other := testdb.New(t), testdb.NewEmpty(t)
	ctx := testCtx(t)
	var logs testlog.Buffer
	opts, held := watchHolds(leasehistory.Options{GapWait: 10 * time.Minute,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	sub := subscribe(t, ctx, db.Pool, opts)

	elsewhere, err := other.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer elsewhere.Rollback(ctx) //nolint:errcheck
	if _, err := elsewhere.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
		t.Fatal(err)
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	insertEvent(t, ctx, tx, 1, "acquired", nil, nil)
	kept := insertEvent(t, ctx, db.Pool, 1, "renewed", nil, nil)
	// The subscriber holds at the hole for tx, and only for transactions of
	// its own database.
	if vxids := held.waitHeldFor(t, sub, vxidOf(t, ctx, tx)); slices.Contains(vxids, vxidOf(t, ctx, elsewhere)) {
		t.Fatalf("the hole waits for %v, which includes another database's transaction", vxids)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if ev := next(t, sub); ev.EventID != kept {
		t.Fatalf("event %d; want %d", ev.EventID, kept)
	}
	if strings.Contains(logs.String(), "gap wait bound") {
		t.Fatalf("a hole waited for the bound:\n%s", logs.String())
	}
}

// The listener's connection is killed twice while a producer keeps
// inserting: every event arrives exactly once, in order.
func TestListenerConnectionKilled(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := testCtx(t)

	b := make([]byte, 4)
	_, _ = rand.Read(b)
	appName := "lh_test_" + hex.EncodeToString(b)
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = appName
	subPool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer subPool.Close()

	sub := subscribe(t, ctx, subPool, leasehistory.Options{
		Cursor:           leasehistory.EncodeCursor(0),
		ReconnectBackoff: 20 * time.Millisecond,
	})

	const total = 300
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range total {
			if _, err := db.Pool.Exec(ctx, `INSERT INTO ff_lease_event (execution_id, event_type, occurred_at_ms, partition_key)
VALUES (gen_random_uuid()::text, 'renewed', 0, $1)`, i%256); err != nil {
				t.Errorf("producer: %v", err)
				return
			}
			if i%10 == 0 {
				time.Sleep(5 * time.Millisecond)
			}
		}
	}()
	defer wg.Wait()

	kill := func() {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
FROM pg_stat_activity WHERE application_name = $1`, appName).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			t.Fatal("no subscriber connection to terminate")
		}
	}
	var got []int64
	disconnects := 0
	deadline := time.After(30 * time.Second)
	for len(got) < total {
		select {
		case ev, ok := <-sub.Events():
			if !ok {
				t.Fatalf("subscription ended: %v", sub.Err())
			}
			if ev.Type == leasehistory.EventDisconnected {
				if ev.Err == nil || ev.Cursor.IsZero() {
					t.Errorf("disconnect notice without error or cursor: %+v", ev)
				}
				disconnects++
				continue
			}
			got = append(got, ev.EventID)
			if len(got) == 50 || len(got) == 150 {
				kill()
			}
		case <-deadline:
			t.Fatalf("received %d of %d events", len(got), total)
		}
	}
	for i, id := range got {
		if id != int64(i+1) {
			t.Fatalf("event #%d has id %d; want %d (got %v)", i, id, i+1, got)
		}
	}
	if disconnects == 0 {
		t.Fatal("no disconnect notice delivered")
	}
}
