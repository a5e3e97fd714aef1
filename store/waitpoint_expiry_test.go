package store_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
)

// neverCommitted is the member_map entry FlowFabric's close_for_execution
// writes for a waitpoint closed at now.
func neverCommitted(now int64) map[string]any {
	return map[string]any{"status": "never_committed", "closed_at_ms": float64(now), "source": "pending_wp_expiry"}
}

// closeWaitpointOne runs CloseWaitpoints for one waitpoint.
func closeWaitpointOne(t *testing.T, db store.DB, p int16, id string, now int64) store.WaitpointCloseResult {
	t.Helper()
	res, err := store.CloseWaitpoints(context.Background(), db, p, []string{id}, now, store.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 {
		t.Fatalf("%d results for one id", len(res))
	}
	return res[0]
}

// suspendedExec inserts a suspended execution of partition p and its
// suspension (timeout ahead, the given member_map, satisfied_set not the
// default) and returns its id.
func suspendedExec(t *testing.T, db store.DB, p int16, memberMap any) string {
	t.Helper()
	id := fftest.InsertExec(t, db, fftest.Exec{Partition: p, LifecyclePhase: "suspended", OwnershipState: "unowned",
		PublicState: "suspended", AttemptState: "attempt_interrupted", Namespace: "tenant-w",
		Tags: map[string]string{"cairn.instance_id": "inst-w"}})
	fftest.InsertSuspension(t, db, fftest.Suspension{Partition: p, ExecutionID: id, TimeoutAtMs: fftest.Ms(99_000_000),
		Behavior: fftest.Str("fail"), MemberMap: memberMap})
	if _, err := db.Exec(context.Background(), `UPDATE ff_suspension_current SET satisfied_set = '["sig-x"]'
		WHERE partition_key = $1 AND execution_id = $2`, p, id); err != nil {
		t.Fatal(err)
	}
	return id
}

// checkNoWaitpointEvents checks that closing waitpoints wrote no completion
// or lease event at all (FlowFabric writes none).
func checkNoWaitpointEvents(t *testing.T, db store.DB) {
	t.Helper()
	if n := fftest.Count(t, db, `SELECT (SELECT count(*) FROM ff_completion_event) + (SELECT count(*) FROM ff_lease_event)`); n != 0 {
		t.Fatalf("%d completion or lease events; closing a waitpoint writes none", n)
	}
}

// TestCloseWaitpoints proves CloseWaitpoints writes exactly what FlowFabric's
// close_for_execution writes for an expired waitpoint, whatever its state
// (pending or active): the waitpoint deleted, and its suspension's
// member_map given {"status":"never_committed","closed_at_ms":now,
// "source":"pending_wp_expiry"} under the waitpoint_key (the waitpoint id,
// lower-case and hyphenated, when the key is empty), replacing any value
// under that key whole and keeping the other keys; nothing else: the
// suspension's other columns, the execution row and the execution's other
// waitpoints untouched, no event; a second call is a no-op. A regression
// shows as a marker missing, merged into the old value, under the wrong key,
// as another column, row or event written, or as a DeadlineMs other than
// the seeded expiry.
func TestCloseWaitpoints(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t).Pool
	const now = int64(4_000_000)

	tests := []struct {
		name  string
		state string
		key   string // "" keys the marker by the waitpoint id
		upper bool   // the waitpoint id is given upper-case
	}{
		{name: "ActiveWithKey", state: "active", key: "wpk:approval"},
		{name: "PendingWithKey", state: "pending", key: "wpk:approval"},
		{name: "ActiveEmptyKey", state: "active"},
		{name: "PendingEmptyKeyUpperCaseID", state: "pending", upper: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			const p = int16(5)
			old := map[string]any{"status": "pending", "note": "replaced whole"}
			other := map[string]any{"status": "delivered", "signal_id": "s-1"}
			wid := fftest.NewUUID()
			key := tt.key
			if key == "" {
				key = wid
			}
			if tt.upper {
				wid = strings.ToUpper(wid)
			}
			id := suspendedExec(t, pool, p, map[string]any{key: old, "wpk:other": other})
			fftest.InsertWaitpoint(t, pool, fftest.Waitpoint{Partition: p, ID: wid, ExecutionID: id, Key: tt.key,
				State: tt.state, ExpiresAtMs: fftest.Ms(now - 1)})
			sibling := fftest.InsertWaitpoint(t, pool, fftest.Waitpoint{Partition: p, ExecutionID: id, Key: "wpk:other",
				State: tt.state, ExpiresAtMs: fftest.Ms(now + 60_000)})
			susBefore, execBefore := fftest.SuspensionJSON(t, pool, p, id), fftest.ExecJSON(t, pool, p, id)

			res := closeWaitpointOne(t, pool, p, wid, now)
			want := store.WaitpointCloseResult{Closed: true, ExecutionID: id, Key: key, Marked: true, DeadlineMs: now - 1}
			if res != want {
				t.Fatalf("result = %+v; want %+v", res, want)
			}
			if fftest.WaitpointExists(t, pool, p, wid) {
				t.Fatal("waitpoint not deleted")
			}
			if !fftest.WaitpointExists(t, pool, p, sibling) {
				t.Fatal("the execution's waitpoint not yet expired was deleted")
			}
			sus := fftest.SuspensionJSON(t, pool, p, id)
			wantSus := withCols(susBefore, map[string]any{"member_map": map[string]any{key: neverCommitted(now), "wpk:other": other}})
			if !jsonEqual(sus, wantSus) {
				t.Fatalf("suspension:\ngot  %v\nwant %v", sus, wantSus)
			}
			if ex := fftest.ExecJSON(t, pool, p, id); !jsonEqual(ex, execBefore) {
				t.Fatalf("execution changed:\nbefore %v\nafter  %v", execBefore, ex)
			}
			checkNoWaitpointEvents(t, pool)

			// A second call (the job ran twice) changes nothing: the row is gone.
			if res := closeWaitpointOne(t, pool, p, wid, now+5); res != (store.WaitpointCloseResult{}) {
				t.Fatalf("second call = %+v; want a no-op", res)
			}
			if again := fftest.SuspensionJSON(t, pool, p, id); !jsonEqual(again, sus) {
				t.Fatalf("second call changed the suspension:\ngot  %v\nwant %v", again, sus)
			}
		})
	}

	// A member_map that is not a JSON object is replaced by an object
	// holding only the marker, as FlowFabric does, and reported.
	notObjects := []struct {
		name string
		mm   any
		text string
	}{
		{name: "Array", mm: []any{"legacy", 1}, text: `["legacy", 1]`},
		{name: "String", mm: "legacy", text: `"legacy"`},
		{name: "JSONNull", mm: json.RawMessage(`null`), text: `null`},
		{name: "Number", mm: 7, text: `7`},
	}
	for _, tt := range notObjects {
		t.Run("NonObjectMemberMapIsReplaced/"+tt.name, func(t *testing.T) {
			const p = int16(6)
			id := suspendedExec(t, pool, p, tt.mm)
			wid := fftest.InsertWaitpoint(t, pool, fftest.Waitpoint{Partition: p, ExecutionID: id, Key: "wpk:k",
				ExpiresAtMs: fftest.Ms(now - 1)})
			susBefore := fftest.SuspensionJSON(t, pool, p, id)
			res := closeWaitpointOne(t, pool, p, wid, now)
			want := store.WaitpointCloseResult{Closed: true, ExecutionID: id, Key: "wpk:k", Marked: true, MemberMapReplaced: tt.text,
				DeadlineMs: now - 1}
			if res != want {
				t.Fatalf("result = %+v; want %+v", res, want)
			}
			wantSus := withCols(susBefore, map[string]any{"member_map": map[string]any{"wpk:k": neverCommitted(now)}})
			if sus := fftest.SuspensionJSON(t, pool, p, id); !jsonEqual(sus, wantSus) {
				t.Fatalf("suspension:\ngot  %v\nwant %v", sus, wantSus)
			}
		})
	}

	t.Run("NoSuspension", func(t *testing.T) {
		// The execution resumed another way: the waitpoint is deleted and
		// nothing else happens.
		const p = int16(7)
		id := fftest.InsertExec(t, pool, fftest.Exec{Partition: p})
		execBefore := fftest.ExecJSON(t, pool, p, id)
		wid := fftest.InsertWaitpoint(t, pool, fftest.Waitpoint{Partition: p, ExecutionID: id, Key: "wpk:k",
			State: "active", ExpiresAtMs: fftest.Ms(now - 1)})
		res := closeWaitpointOne(t, pool, p, wid, now)
		if want := (store.WaitpointCloseResult{Closed: true, ExecutionID: id, Key: "wpk:k", DeadlineMs: now - 1}); res != want {
			t.Fatalf("result = %+v; want %+v", res, want)
		}
		if fftest.WaitpointExists(t, pool, p, wid) {
			t.Fatal("waitpoint not deleted")
		}
		if _, ok := fftest.ReadSuspension(t, pool, p, id); ok {
			t.Fatal("a suspension was created")
		}
		if ex := fftest.ExecJSON(t, pool, p, id); !jsonEqual(ex, execBefore) {
			t.Fatalf("execution changed:\nbefore %v\nafter  %v", execBefore, ex)
		}
	})

	t.Run("SuspensionOfAnotherPartitionUntouched", func(t *testing.T) {
		// FlowFabric reads the suspension at the waitpoint's partition only.
		id := suspendedExec(t, pool, 9, map[string]any{})
		wid := fftest.InsertWaitpoint(t, pool, fftest.Waitpoint{Partition: 8, ExecutionID: id, Key: "wpk:k",
			ExpiresAtMs: fftest.Ms(now - 1)})
		before := fftest.SuspensionJSON(t, pool, 9, id)
		res := closeWaitpointOne(t, pool, 8, wid, now)
		if want := (store.WaitpointCloseResult{Closed: true, ExecutionID: id, Key: "wpk:k", ExecMissing: true, DeadlineMs: now - 1}); res != want {
			t.Fatalf("result = %+v; want %+v", res, want)
		}
		if after := fftest.SuspensionJSON(t, pool, 9, id); !jsonEqual(after, before) {
			t.Fatalf("suspension of partition 9 changed:\nbefore %v\nafter  %v", before, after)
		}
	})

	t.Run("ExecutionMissing", func(t *testing.T) {
		// The waitpoint is closed all the same, its suspension (if any)
		// marked, and the missing row reported.
		const p = int16(10)
		withSus, withoutSus := fftest.NewUUID(), fftest.NewUUID()
		fftest.InsertSuspension(t, pool, fftest.Suspension{Partition: p, ExecutionID: withSus, MemberMap: map[string]any{"a": 1}})
		w1 := fftest.InsertWaitpoint(t, pool, fftest.Waitpoint{Partition: p, ExecutionID: withSus, Key: "wpk:1", ExpiresAtMs: fftest.Ms(now - 1)})
		w2 := fftest.InsertWaitpoint(t, pool, fftest.Waitpoint{Partition: p, ExecutionID: withoutSus, Key: "wpk:2", ExpiresAtMs: fftest.Ms(now - 1)})
		got, err := store.CloseWaitpoints(context.Background(), pool, p, []string{w1, w2}, now, store.Filter{})
		if err != nil {
			t.Fatal(err)
		}
		want := []store.WaitpointCloseResult{
			{Closed: true, ExecutionID: withSus, Key: "wpk:1", Marked: true, ExecMissing: true, DeadlineMs: now - 1},
			{Closed: true, ExecutionID: withoutSus, Key: "wpk:2", ExecMissing: true, DeadlineMs: now - 1},
		}
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("waitpoint %d = %+v; want %+v", i, got[i], want[i])
			}
		}
		su, _ := fftest.ReadSuspension(t, pool, p, withSus)
		if !jsonEqual(su.MemberMap, map[string]any{"a": float64(1), "wpk:1": neverCommitted(now)}) {
			t.Fatalf("member_map = %s; want a kept and wpk:1 marked", su.MemberMapText)
		}
		if fftest.WaitpointExists(t, pool, p, w1) || fftest.WaitpointExists(t, pool, p, w2) {
			t.Fatal("waitpoints not deleted")
		}
	})
}

// TestCloseWaitpointsNoOps proves the guard of close_for_execution: a
// waitpoint whose expiry is ahead, exactly now (FlowFabric's strict <) or
// NULL, or that does not exist in the partition asked for, is left as it is
// and its suspension untouched. A regression shows as a waitpoint deleted
// before its time or a marker written for it.
func TestCloseWaitpointsNoOps(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t).Pool
	const now, p = int64(4_000_000), int16(14)

	tests := []struct {
		name    string
		expires *int64
		gone    bool  // no waitpoint row
		call    int16 // partition to call with (default p)
	}{
		{name: "ExpiryAhead", expires: fftest.Ms(now + 1)},
		{name: "ExpiryIsNow", expires: fftest.Ms(now)},
		{name: "ExpiryNull"},
		{name: "OtherPartition", expires: fftest.Ms(now - 1), call: p + 1},
		{name: "Gone", gone: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := suspendedExec(t, pool, p, map[string]any{"wpk:k": "waiting"})
			wid := fftest.NewUUID()
			if !tt.gone {
				fftest.InsertWaitpoint(t, pool, fftest.Waitpoint{Partition: p, ID: wid, ExecutionID: id, Key: "wpk:k",
					State: "active", ExpiresAtMs: tt.expires})
			}
			before := fftest.SuspensionJSON(t, pool, p, id)
			call := tt.call
			if call == 0 {
				call = p
			}
			if res := closeWaitpointOne(t, pool, call, wid, now); res != (store.WaitpointCloseResult{}) {
				t.Fatalf("result = %+v; want a no-op", res)
			}
			if !tt.gone && !fftest.WaitpointExists(t, pool, p, wid) {
				t.Fatal("waitpoint deleted")
			}
			if after := fftest.SuspensionJSON(t, pool, p, id); !jsonEqual(after, before) {
				t.Fatalf("suspension changed:\nbefore %v\nafter  %v", before, after)
			}
		})
	}
}

// TestCloseWaitpointsOfOneSuspension proves that every expired waitpoint of
// one suspension lands in its member_map, as FlowFabric's one transaction per
// waitpoint (each locking the suspension in turn) leaves it: two closed in
// one batch (one keyed, one by its id), and a third closed by a later call,
// which keeps the first two markers and their closed_at_ms. The regression
// this guards: a set-based update in which one waitpoint's marker overwrites
// the other's (both written from the member_map as it was before the
// statement), a marker landing on another execution's suspension, or a
// waitpoint given another's DeadlineMs.
func TestCloseWaitpointsOfOneSuspension(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t).Pool
	const now, p = int64(4_000_000), int16(15)

	id := suspendedExec(t, pool, p, map[string]any{"keep": "me"})
	w1 := fftest.InsertWaitpoint(t, pool, fftest.Waitpoint{Partition: p, ExecutionID: id, Key: "wpk:a", State: "active",
		ExpiresAtMs: fftest.Ms(now - 10)})
	w2 := fftest.InsertWaitpoint(t, pool, fftest.Waitpoint{Partition: p, ExecutionID: id, State: "active",
		ExpiresAtMs: fftest.Ms(now - 1)})
	w3 := fftest.InsertWaitpoint(t, pool, fftest.Waitpoint{Partition: p, ExecutionID: id, Key: "wpk:c", State: "active",
		ExpiresAtMs: fftest.Ms(now + 100)})
	// Another suspension in the same batch, so a marker landing on the
	// wrong one shows.
	other := suspendedExec(t, pool, p, map[string]any{})
	wo := fftest.InsertWaitpoint(t, pool, fftest.Waitpoint{Partition: p, ExecutionID: other, Key: "wpk:o",
		ExpiresAtMs: fftest.Ms(now - 1)})

	got, err := store.CloseWaitpoints(ctx, pool, p, []string{w1, wo, w3, w2}, now, store.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	// DeadlineMs is each waitpoint's own seeded expiry.
	want := []store.WaitpointCloseResult{
		{Closed: true, ExecutionID: id, Key: "wpk:a", Marked: true, DeadlineMs: now - 10},
		{Closed: true, ExecutionID: other, Key: "wpk:o", Marked: true, DeadlineMs: now - 1},
		{},
		{Closed: true, ExecutionID: id, Key: w2, Marked: true, DeadlineMs: now - 1},
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("waitpoint %d = %+v; want %+v", i, got[i], want[i])
		}
	}
	memberMap := func(exec string) any {
		su, ok := fftest.ReadSuspension(t, pool, p, exec)
		if !ok {
			t.Fatalf("suspension of %s deleted", exec)
		}
		return su.MemberMap
	}
	wantMM := map[string]any{"keep": "me", "wpk:a": neverCommitted(now), w2: neverCommitted(now)}
	if mm := memberMap(id); !jsonEqual(mm, wantMM) {
		t.Fatalf("member_map = %v; want both markers and keep", mm)
	}
	if mm := memberMap(other); !jsonEqual(mm, map[string]any{"wpk:o": neverCommitted(now)}) {
		t.Fatalf("other suspension's member_map = %v; want only its own marker", mm)
	}

	// The third expires later and is closed by another call: the first two
	// markers stay as they were.
	res := closeWaitpointOne(t, pool, p, w3, now+200)
	if want := (store.WaitpointCloseResult{Closed: true, ExecutionID: id, Key: "wpk:c", Marked: true, DeadlineMs: now + 100}); res != want {
		t.Fatalf("later close = %+v; want %+v", res, want)
	}
	wantMM["wpk:c"] = neverCommitted(now + 200)
	if mm := memberMap(id); !jsonEqual(mm, wantMM) {
		t.Fatalf("member_map = %v; want %v", mm, wantMM)
	}
	if n := fftest.Count(t, pool, `SELECT count(*) FROM ff_waitpoint_pending WHERE partition_key = $1`, p); n != 0 {
		t.Fatalf("%d waitpoints left; want all closed", n)
	}
}

// TestCloseWaitpointsRechecksUnderLock proves the waitpoint is re-checked, and
// everything written is read, under the row locks: a transaction that holds
// the waitpoint (or its suspension) when CloseWaitpoints starts and commits
// while it waits decides the outcome, as in FlowFabric, whose later
// statements run after the lock. A signal that deleted the waitpoint, or a
// cleared or moved expiry, wins: nothing closed, member_map as the signal
// left it. A changed waitpoint_key is the key marked. A suspend that
// activated the pending waitpoint and created the suspension gets the
// marker. A signal for another waitpoint of the suspension keeps its entry
// (the marker merges into the member_map committed meanwhile), and whether
// member_map was an object, hence replaced and reported, is decided on that
// committed version. A regression shows as a waitpoint closed after a
// signal resolved it, a lost member_map entry, a marker under a stale key, a
// suspension left unmarked, MemberMapReplaced reporting a member_map that
// was not the one replaced, or a DeadlineMs other than the expiry closed.
func TestCloseWaitpointsRechecksUnderLock(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t).Pool
	const now, p = int64(4_000_000), int16(17)
	const byWaitpoint = `WHERE partition_key = @p AND waitpoint_id = @wp`
	const bySuspension = `WHERE partition_key = @p AND execution_id = @exec`

	tests := []struct {
		name         string
		noSuspension bool
		memberMap    any      // the suspension's member_map (nil: {"wpk:a": "waiting"})
		change       []string // @p partition, @wp waitpoint id, @exec execution id, @now now
		closed       bool
		exists       bool // the waitpoint still exists afterwards
		key          string
		replaced     string // the result's MemberMapReplaced
		// wantMemberMap is the member_map afterwards; nil: as the change
		// left it.
		wantMemberMap map[string]any
	}{
		{name: "DeletedBySignal", change: []string{
			`DELETE FROM ff_waitpoint_pending ` + byWaitpoint,
			`UPDATE ff_suspension_current SET member_map = member_map || '{"wpk:a": {"status": "delivered"}}' ` + bySuspension}},
		{name: "ExpiryClearedMeanwhile", exists: true,
			change: []string{`UPDATE ff_waitpoint_pending SET expires_at_ms = NULL ` + byWaitpoint}},
		{name: "ExpiryMovedMeanwhile", exists: true,
			change: []string{`UPDATE ff_waitpoint_pending SET expires_at_ms = @now + 60000 ` + byWaitpoint}},
		{name: "KeyChangedMeanwhile", closed: true, key: "wpk:renamed",
			change:        []string{`UPDATE ff_waitpoint_pending SET waitpoint_key = 'wpk:renamed' ` + byWaitpoint},
			wantMemberMap: map[string]any{"wpk:a": "waiting", "wpk:renamed": neverCommitted(now)}},
		{name: "SignalForAnotherWaitpointMeanwhile", closed: true, key: "wpk:a",
			change:        []string{`UPDATE ff_suspension_current SET member_map = member_map || '{"wpk:b": {"status": "delivered"}}' ` + bySuspension},
			wantMemberMap: map[string]any{"wpk:a": neverCommitted(now), "wpk:b": map[string]any{"status": "delivered"}}},
		{name: "MemberMapRepairedMeanwhile", memberMap: []any{"legacy"}, closed: true, key: "wpk:a",
			change:        []string{`UPDATE ff_suspension_current SET member_map = '{"wpk:b": "delivered"}' ` + bySuspension},
			wantMemberMap: map[string]any{"wpk:a": neverCommitted(now), "wpk:b": "delivered"}},
		{name: "MemberMapBrokenMeanwhile", closed: true, key: "wpk:a", replaced: `["odd"]`,
			change:        []string{`UPDATE ff_suspension_current SET member_map = '["odd"]' ` + bySuspension},
			wantMemberMap: map[string]any{"wpk:a": neverCommitted(now)}},
		{name: "SuspendedMeanwhile", noSuspension: true, closed: true, key: "wpk:a",
			change: []string{
				`UPDATE ff_waitpoint_pending SET state = 'active', activated_at_ms = @now - 1 ` + byWaitpoint,
				`INSERT INTO ff_suspension_current (partition_key, execution_id, suspension_id, suspended_at_ms, timeout_at_ms,
				        reason_code, condition, member_map)
				 VALUES (@p, @exec, gen_random_uuid(), @now - 1, @now + 60000, 'wait', '{}', '{"wpk:z": "waiting"}')`},
			wantMemberMap: map[string]any{"wpk:a": neverCommitted(now), "wpk:z": "waiting"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var id string
			if tt.noSuspension {
				id = fftest.InsertExec(t, pool, fftest.Exec{Partition: p})
			} else {
				mm := tt.memberMap
				if mm == nil {
					mm = map[string]any{"wpk:a": "waiting"}
				}
				id = suspendedExec(t, pool, p, mm)
			}
			wid := fftest.InsertWaitpoint(t, pool, fftest.Waitpoint{Partition: p, ExecutionID: id, Key: "wpk:a",
				ExpiresAtMs: fftest.Ms(now - 1)})
			execBefore := fftest.ExecJSON(t, pool, p, id)

			var committed map[string]any // the suspension as the change left it
			res := commitWhileBlocked(t, pool, "ff_waitpoint_pending", func(ctx context.Context, tx pgx.Tx) error {
				args := pgx.NamedArgs{"p": p, "wp": wid, "exec": id, "now": now}
				for _, sql := range tt.change {
					if _, err := tx.Exec(ctx, sql, args); err != nil {
						return err
					}
				}
				committed = fftest.SuspensionJSON(t, tx, p, id)
				return nil
			}, func(ctx context.Context) (store.WaitpointCloseResult, error) {
				res, err := store.CloseWaitpoints(ctx, pool, p, []string{wid}, now, store.Filter{})
				if err != nil {
					return store.WaitpointCloseResult{}, err
				}
				return res[0], nil
			})

			var want store.WaitpointCloseResult
			if tt.closed {
				// No change that closes moves the expiry: the seeded one.
				want = store.WaitpointCloseResult{Closed: true, ExecutionID: id, Key: tt.key, Marked: true, MemberMapReplaced: tt.replaced,
					DeadlineMs: now - 1}
			}
			if res != want {
				t.Fatalf("result = %+v; want %+v", res, want)
			}
			if exists := fftest.WaitpointExists(t, pool, p, wid); exists != tt.exists {
				t.Fatalf("waitpoint exists = %v; want %v", exists, tt.exists)
			}
			wantSus := committed
			if tt.wantMemberMap != nil {
				wantSus = withCols(committed, map[string]any{"member_map": tt.wantMemberMap})
			}
			if sus := fftest.SuspensionJSON(t, pool, p, id); !jsonEqual(sus, wantSus) {
				t.Fatalf("suspension:\ngot  %v\nwant %v", sus, wantSus)
			}
			if ex := fftest.ExecJSON(t, pool, p, id); !jsonEqual(ex, execBefore) {
				t.Fatalf("execution changed:\nbefore %v\nafter  %v", execBefore, ex)
			}
		})
	}
}

// TestCloseWaitpointsBatch proves a batch gives every waitpoint the result it
// gets alone, in input order: closed ones keyed and marked on their own
// suspensions, one without a suspension, one whose execution is missing,
// no-ops (expiry ahead, unknown id) in between, and an id repeated, a no-op
// the second time as a second call would be. A regression shows as results
// shifted between ids, a repeated id reported closed twice, or a DeadlineMs
// other than the waitpoint's own expiry.
func TestCloseWaitpointsBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t).Pool
	const now, p = int64(4_000_000), int16(19)

	a := suspendedExec(t, pool, p, map[string]any{"x": 1})
	wa := fftest.InsertWaitpoint(t, pool, fftest.Waitpoint{Partition: p, ExecutionID: a, Key: "wpk:a", ExpiresAtMs: fftest.Ms(now - 1)})
	b := suspendedExec(t, pool, p, []any{"old"})
	wb := fftest.InsertWaitpoint(t, pool, fftest.Waitpoint{Partition: p, ExecutionID: b, State: "active", ExpiresAtMs: fftest.Ms(now - 7)})
	ahead := fftest.InsertWaitpoint(t, pool, fftest.Waitpoint{Partition: p, ExecutionID: a, Key: "wpk:later", ExpiresAtMs: fftest.Ms(now + 1)})
	noSus := fftest.InsertExec(t, pool, fftest.Exec{Partition: p})
	wn := fftest.InsertWaitpoint(t, pool, fftest.Waitpoint{Partition: p, ExecutionID: noSus, Key: "wpk:n", ExpiresAtMs: fftest.Ms(now - 1)})
	orphan := fftest.NewUUID()
	wo := fftest.InsertWaitpoint(t, pool, fftest.Waitpoint{Partition: p, ExecutionID: orphan, Key: "wpk:o", ExpiresAtMs: fftest.Ms(now - 1)})
	unknown := fftest.NewUUID()

	ids := []string{wa, ahead, wb, unknown, wn, wa, wo}
	got, err := store.CloseWaitpoints(ctx, pool, p, ids, now, store.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	want := []store.WaitpointCloseResult{
		{Closed: true, ExecutionID: a, Key: "wpk:a", Marked: true, DeadlineMs: now - 1},
		{},
		{Closed: true, ExecutionID: b, Key: wb, Marked: true, MemberMapReplaced: `["old"]`, DeadlineMs: now - 7},
		{},
		{Closed: true, ExecutionID: noSus, Key: "wpk:n", DeadlineMs: now - 1},
		{}, // wa again: gone since the first
		{Closed: true, ExecutionID: orphan, Key: "wpk:o", ExecMissing: true, DeadlineMs: now - 1},
	}
	if len(got) != len(want) {
		t.Fatalf("%d results for %d ids", len(got), len(ids))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("id %d (%s) = %+v, want %+v", i, ids[i], got[i], want[i])
		}
	}
	for _, c := range []struct {
		exec string
		mm   map[string]any
	}{
		{a, map[string]any{"x": float64(1), "wpk:a": neverCommitted(now)}},
		{b, map[string]any{wb: neverCommitted(now)}},
	} {
		if su, _ := fftest.ReadSuspension(t, pool, p, c.exec); !jsonEqual(su.MemberMap, c.mm) {
			t.Errorf("member_map of %s = %s; want %v", c.exec, su.MemberMapText, c.mm)
		}
	}
	if !fftest.WaitpointExists(t, pool, p, ahead) {
		t.Error("waitpoint not yet expired was deleted")
	}
	checkNoWaitpointEvents(t, pool)
}
