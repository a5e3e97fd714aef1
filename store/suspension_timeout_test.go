package store_test

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
)

// TestExpireSuspensionTerminalBehaviours: every terminal behaviour (and NULL
// and an unknown value, which mean fail) makes the execution terminal as the
// seed writes it, deletes the suspension and writes one completion event
// carrying the execution's flow, namespace and instance tag. A regression in
// DeadlineMs shows as other than the deleted row's timeout (0 on a no-op).
func TestExpireSuspensionTerminalBehaviours(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	pool := db.Pool
	const now = int64(5_000_000)

	tests := []struct {
		name     string
		behavior *string
		action   string
		outcome  string // the completion event's: FlowFabric's Postgres outcome
		public   string // public_state, and the current attempt's outcome
		unknown  bool
	}{
		{name: "NullIsFail", behavior: nil, action: "fail", outcome: "expired", public: "failed"},
		{name: "Fail", behavior: fftest.Str("fail"), action: "fail", outcome: "expired", public: "failed"},
		{name: "Cancel", behavior: fftest.Str("cancel"), action: "cancel", outcome: "cancelled", public: "cancelled"},
		{name: "Expire", behavior: fftest.Str("expire"), action: "expire", outcome: "expired", public: "expired"},
		{name: "Escalate", behavior: fftest.Str("escalate"), action: "escalate", outcome: "expired", public: "expired"},
		{name: "UnknownIsFail", behavior: fftest.Str("explode"), action: "fail", outcome: "expired", public: "failed", unknown: true},
		{name: "EmptyIsUnknownFail", behavior: fftest.Str(""), action: "fail", outcome: "expired", public: "failed", unknown: true},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := int16(20 + i)
			flow := fftest.NewUUID()
			id := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, FlowID: flow, Namespace: "tenant-a",
				LifecyclePhase: "suspended", OwnershipState: "unowned", EligibilityState: "not_applicable",
				PublicState: "suspended", AttemptState: "attempt_interrupted",
				Tags: map[string]string{"cairn.instance_id": "inst-1", "other": "x"}})
			fftest.InsertAttempt(t, pool, p, id, 0, nil)
			fftest.InsertSuspension(t, pool, fftest.Suspension{Partition: p, ExecutionID: id,
				TimeoutAtMs: fftest.Ms(now - 1), Behavior: tt.behavior})

			res, err := store.ExpireSuspension(ctx, pool, p, id, now, store.Filter{})
			if err != nil {
				t.Fatal(err)
			}
			if !res.Applied || res.Action != tt.action || res.UnknownBehavior != tt.unknown ||
				res.ExecMissing || res.RawFieldsMalformed || res.Outcome != tt.outcome || res.EventID == 0 {
				t.Fatalf("result = %+v; want applied %s, outcome %s, unknown %v, event written", res, tt.action, tt.outcome, tt.unknown)
			}
			// The row is deleted: DeadlineMs is its timeout, read under the
			// lock before.
			if res.DeadlineMs != now-1 {
				t.Fatalf("DeadlineMs = %d; want the suspension's timeout %d", res.DeadlineMs, now-1)
			}
			ex := fftest.ReadExec(t, pool, p, id)
			if ex.LifecyclePhase != "terminal" || ex.OwnershipState != "unowned" ||
				ex.EligibilityState != "not_applicable" || ex.AttemptState != "attempt_terminal" {
				t.Fatalf("exec = %+v; want terminal/unowned/not_applicable/attempt_terminal", ex)
			}
			// The seed leaves `suspended` on a terminal row; FlowFabric's
			// Valkey engine writes what the behaviour made of it.
			if ex.PublicState != tt.public || ex.BlockingReason != nil {
				t.Fatalf("public_state, blocking_reason = %q, %s; want %s, NULL", ex.PublicState, fftest.Deref(ex.BlockingReason), tt.public)
			}
			if att := fftest.ReadAttempt(t, pool, p, id, 0); fftest.Deref(att.Outcome) != tt.public {
				t.Fatalf("current attempt's outcome = %s; want %s", fftest.Deref(att.Outcome), tt.public)
			}
			if ex.TerminalAtMs == nil || *ex.TerminalAtMs != now {
				t.Fatalf("terminal_at_ms = %v; want %d", ex.TerminalAtMs, now)
			}
			if want := "suspension_timeout_" + tt.action; ex.CancellationReason == nil || *ex.CancellationReason != want {
				t.Fatalf("cancellation_reason = %v; want %s", ex.CancellationReason, want)
			}
			if ex.RawFields["last_failure_message"] != "suspension_timeout" || ex.RawFields["namespace"] != "tenant-a" {
				t.Fatalf("raw_fields = %v; want last_failure_message added, namespace kept", ex.RawFields)
			}
			if _, ok := fftest.ReadSuspension(t, pool, p, id); ok {
				t.Fatal("suspension row not deleted")
			}
			evs := fftest.CompletionEvents(t, pool, id)
			if len(evs) != 1 {
				t.Fatalf("%d completion events; want 1", len(evs))
			}
			ev := evs[0]
			if ev.EventID != res.EventID || ev.Partition != p || ev.Outcome != tt.outcome || ev.OccurredAtMs != now ||
				ev.FlowID == nil || *ev.FlowID != flow || ev.Namespace == nil || *ev.Namespace != "tenant-a" ||
				ev.InstanceTag == nil || *ev.InstanceTag != "inst-1" {
				t.Fatalf("event = %+v; want %s, flow %s, namespace tenant-a, tag inst-1, at now", ev, tt.outcome, flow)
			}

			// A second run (the job ran twice) changes nothing.
			res, err = store.ExpireSuspension(ctx, pool, p, id, now+5, store.Filter{})
			if err != nil || res.Applied || res.DeadlineMs != 0 {
				t.Fatalf("second run = %+v, %v; want no-op, DeadlineMs 0", res, err)
			}
			if n := len(fftest.CompletionEvents(t, pool, id)); n != 1 {
				t.Fatalf("%d completion events after a second run; want 1", n)
			}
		})
	}

	t.Run("MissingExecutionWritesNoEvent", func(t *testing.T) {
		id := fftest.NewUUID()
		fftest.InsertSuspension(t, pool, fftest.Suspension{Partition: 30, ExecutionID: id, TimeoutAtMs: fftest.Ms(now - 1)})
		res, err := store.ExpireSuspension(ctx, pool, 30, id, now, store.Filter{})
		if err != nil || !res.Applied || !res.ExecMissing || res.EventID != 0 {
			t.Fatalf("result = %+v, %v; want applied, exec missing, no event", res, err)
		}
		if _, ok := fftest.ReadSuspension(t, pool, 30, id); ok {
			t.Fatal("suspension row not deleted")
		}
		if n := len(fftest.CompletionEvents(t, pool, id)); n != 0 {
			t.Fatalf("%d completion events; want 0, as the seed", n)
		}
	})

	t.Run("MalformedRawFieldsAreKept", func(t *testing.T) {
		id := fftest.InsertExec(t, pool, fftest.Exec{Partition: 31, LifecyclePhase: "suspended", RawFields: []any{"x"}})
		fftest.InsertSuspension(t, pool, fftest.Suspension{Partition: 31, ExecutionID: id, TimeoutAtMs: fftest.Ms(now - 1)})
		res, err := store.ExpireSuspension(ctx, pool, 31, id, now, store.Filter{})
		if err != nil || !res.Applied || !res.RawFieldsMalformed || res.EventID == 0 {
			t.Fatalf("result = %+v, %v; want applied, raw_fields malformed, event written", res, err)
		}
		ex := fftest.ReadExec(t, pool, 31, id)
		if ex.LifecyclePhase != "terminal" || ex.RawFieldsText != `["x"]` {
			t.Fatalf("exec = %s, raw_fields %s; want terminal with raw_fields kept", ex.LifecyclePhase, ex.RawFieldsText)
		}
		evs := fftest.CompletionEvents(t, pool, id)
		if len(evs) != 1 || evs[0].Namespace != nil || evs[0].InstanceTag != nil || evs[0].FlowID != nil {
			t.Fatalf("events = %+v; want one with NULL flow, namespace and tag", evs)
		}
	})
}

// TestExpireSuspensionAutoResume: auto-resume appends a timeout signal to
// member_map.__timeout__, clears the timeout and leaves the execution
// suspended; a timeout set again later appends a second signal. A regression
// in DeadlineMs shows as 0 (the cleared timeout read after the update).
func TestExpireSuspensionAutoResume(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	pool := db.Pool
	const now = int64(6_000_000)
	auto := fftest.Str(store.TimeoutAutoResume)
	suspended := func(p int16) fftest.Exec {
		return fftest.Exec{Partition: p, LifecyclePhase: "suspended", OwnershipState: "unowned",
			PublicState: "suspended", AttemptState: "attempt_interrupted"}
	}
	signal := func(at int64) map[string]any {
		return map[string]any{"signal_name": "timeout", "payload": nil, "delivered_at_ms": float64(at), "source": "suspension_timeout"}
	}
	timeoutEntries := func(t *testing.T, p int16, id string) []any {
		t.Helper()
		su, ok := fftest.ReadSuspension(t, pool, p, id)
		if !ok {
			t.Fatal("suspension row deleted")
		}
		if su.TimeoutAtMs != nil {
			t.Fatalf("timeout_at_ms = %d; want NULL", *su.TimeoutAtMs)
		}
		mm, _ := su.MemberMap.(map[string]any)
		arr, _ := mm["__timeout__"].([]any)
		return arr
	}

	t.Run("RepeatGrowsTheArray", func(t *testing.T) {
		id := fftest.InsertExec(t, pool, suspended(40))
		fftest.InsertSuspension(t, pool, fftest.Suspension{Partition: 40, ExecutionID: id, TimeoutAtMs: fftest.Ms(now - 1),
			Behavior: auto, MemberMap: map[string]any{"sig-a": map[string]any{"x": 1}}})
		res, err := store.ExpireSuspension(ctx, pool, 40, id, now, store.Filter{})
		if err != nil || !res.Applied || res.Action != store.TimeoutAutoResume || res.TimeoutSignals != 1 ||
			res.MemberMapReplaced != "" || res.TimeoutEntryNotArray != "" || res.EventID != 0 {
			t.Fatalf("result = %+v, %v; want applied auto-resume with 1 signal, no event", res, err)
		}
		// The resume clears timeout_at_ms: DeadlineMs is the timeout it had.
		if res.DeadlineMs != now-1 {
			t.Fatalf("DeadlineMs = %d; want the cleared timeout %d", res.DeadlineMs, now-1)
		}
		got := timeoutEntries(t, 40, id)
		if len(got) != 1 || !reflect.DeepEqual(got[0], signal(now)) {
			t.Fatalf("__timeout__ = %v; want [%v]", got, signal(now))
		}
		// The row never fires again while its timeout stays cleared.
		if res, err := store.ExpireSuspension(ctx, pool, 40, id, now+10, store.Filter{}); err != nil || res.Applied || res.DeadlineMs != 0 {
			t.Fatalf("re-run = %+v, %v; want no-op, DeadlineMs 0", res, err)
		}

		// A timeout set again fires again and appends.
		if _, err := pool.Exec(ctx, `UPDATE ff_suspension_current SET timeout_at_ms = $1 WHERE partition_key = 40 AND execution_id = $2`,
			now+50, id); err != nil {
			t.Fatal(err)
		}
		res, err = store.ExpireSuspension(ctx, pool, 40, id, now+100, store.Filter{})
		if err != nil || !res.Applied || res.TimeoutSignals != 2 || res.DeadlineMs != now+50 {
			t.Fatalf("second timeout = %+v, %v; want applied with 2 signals, DeadlineMs the timeout set again %d", res, err, now+50)
		}
		got = timeoutEntries(t, 40, id)
		if len(got) != 2 || !reflect.DeepEqual(got[0], signal(now)) || !reflect.DeepEqual(got[1], signal(now+100)) {
			t.Fatalf("__timeout__ = %v; want both signals in order", got)
		}
		su, _ := fftest.ReadSuspension(t, pool, 40, id)
		if mm := su.MemberMap.(map[string]any); mm["sig-a"] == nil {
			t.Fatalf("member_map lost its other entries: %v", mm)
		}
		ex := fftest.ReadExec(t, pool, 40, id)
		if ex.LifecyclePhase != "suspended" || ex.PublicState != "suspended" || ex.TerminalAtMs != nil {
			t.Fatalf("exec = %+v; want it left suspended", ex)
		}
		if n := len(fftest.CompletionEvents(t, pool, id)); n != 0 {
			t.Fatalf("%d completion events; want 0", n)
		}
	})

	t.Run("NonObjectMemberMapIsReplaced", func(t *testing.T) {
		id := fftest.InsertExec(t, pool, suspended(41))
		fftest.InsertSuspension(t, pool, fftest.Suspension{Partition: 41, ExecutionID: id, TimeoutAtMs: fftest.Ms(now - 1),
			Behavior: auto, MemberMap: []any{"legacy"}})
		res, err := store.ExpireSuspension(ctx, pool, 41, id, now, store.Filter{})
		if err != nil || !res.Applied || res.MemberMapReplaced != `["legacy"]` || res.TimeoutSignals != 1 {
			t.Fatalf("result = %+v, %v; want applied, member_map [\"legacy\"] replaced, 1 signal", res, err)
		}
		if got := timeoutEntries(t, 41, id); len(got) != 1 {
			t.Fatalf("__timeout__ = %v; want one signal", got)
		}
	})

	t.Run("NonArrayTimeoutEntryIsKeptAndTheSignalDropped", func(t *testing.T) {
		id := fftest.InsertExec(t, pool, suspended(42))
		fftest.InsertSuspension(t, pool, fftest.Suspension{Partition: 42, ExecutionID: id, TimeoutAtMs: fftest.Ms(now - 1),
			Behavior: auto, MemberMap: map[string]any{"__timeout__": "odd"}})
		res, err := store.ExpireSuspension(ctx, pool, 42, id, now, store.Filter{})
		if err != nil || !res.Applied || res.TimeoutEntryNotArray != "string" || res.TimeoutSignals != 0 {
			t.Fatalf("result = %+v, %v; want applied, __timeout__ string kept, no signal", res, err)
		}
		su, _ := fftest.ReadSuspension(t, pool, 42, id)
		if su.TimeoutAtMs != nil || su.MemberMapText != `{"__timeout__": "odd"}` {
			t.Fatalf("suspension = timeout %v, member_map %s; want cleared, member_map kept", su.TimeoutAtMs, su.MemberMapText)
		}
	})
}

// TestExpireSuspensionResolvedIsLeftAlone: a suspension resolved between the
// scan and the action (deleted by a signal, its timeout cleared or moved to
// the future) is not touched, and its DeadlineMs is 0 (a regression: the
// moved timeout reported).
func TestExpireSuspensionResolvedIsLeftAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	pool := db.Pool
	const now = int64(7_000_000)

	tests := []struct {
		name    string
		resolve string // run after the scan, before the action
	}{
		{name: "Deleted", resolve: `DELETE FROM ff_suspension_current WHERE partition_key = $1 AND execution_id = $2`},
		{name: "TimeoutCleared", resolve: `UPDATE ff_suspension_current SET timeout_at_ms = NULL WHERE partition_key = $1 AND execution_id = $2`},
		{name: "TimeoutMovedToTheFuture", resolve: `UPDATE ff_suspension_current SET timeout_at_ms = 99999999999 WHERE partition_key = $1 AND execution_id = $2`},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := int16(50 + i)
			id := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, LifecyclePhase: "suspended"})
			fftest.InsertSuspension(t, pool, fftest.Suspension{Partition: p, ExecutionID: id, TimeoutAtMs: fftest.Ms(now - 1)})
			scanned, err := store.TimedOutSuspensions.Scan(ctx, pool, p, now, nil, 10, store.Filter{})
			if err != nil || len(scanned) != 1 {
				t.Fatalf("scan = %v, %v; want the row", scanned, err)
			}
			if _, err := pool.Exec(ctx, tt.resolve, p, id); err != nil {
				t.Fatal(err)
			}
			res, err := store.ExpireSuspension(ctx, pool, p, id, now, store.Filter{})
			if err != nil || res.Applied || res.DeadlineMs != 0 {
				t.Fatalf("result = %+v, %v; want no-op, DeadlineMs 0", res, err)
			}
			if ex := fftest.ReadExec(t, pool, p, id); ex.LifecyclePhase != "suspended" {
				t.Fatalf("exec changed: %+v", ex)
			}
			if n := len(fftest.CompletionEvents(t, pool, id)); n != 0 {
				t.Fatalf("%d completion events; want 0", n)
			}
		})
	}
}

// TestExpireSuspensionLeavesAResumedExecutionAlone: FlowFabric's
// deliver_signal resumes an execution (runnable, public_state resumable) but
// leaves its suspension and lapsed timeout in place, and a worker may claim
// it again (active, running) or finish it before the timeout is acted on.
// For every behaviour the action then leaves the execution exactly as it
// is, writes no event, keeps the suspension's member_map (what the resumed
// worker's observe_signals reads) and clears its timeout, so the suspension
// is never due again: one row job at most. A regression shows as a resumed
// execution ended (the seed's behaviour: terminal, suspension_timeout_fail,
// an `expired` completion event), or as a suspension still due after the
// action (a row job at every tick).
func TestExpireSuspensionLeavesAResumedExecutionAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t).Pool
	const now = int64(7_500_000)

	phases := []struct {
		name string
		exec fftest.Exec
	}{
		// deliver_signal's writes (suspend left ownership released,
		// attempt_interrupted).
		{"Resumable", fftest.Exec{LifecyclePhase: "runnable", OwnershipState: "released", EligibilityState: "eligible_now",
			PublicState: "resumable", AttemptState: "attempt_interrupted"}},
		// claim_resumed_execution's writes after that.
		{"ClaimedAgain", fftest.Exec{LifecyclePhase: "active", OwnershipState: "leased", EligibilityState: "not_applicable",
			PublicState: "running", AttemptState: "running_attempt"}},
		{"Completed", fftest.Exec{LifecyclePhase: "terminal", OwnershipState: "unowned", EligibilityState: "not_applicable",
			PublicState: "completed", AttemptState: "attempt_terminal"}},
	}
	behaviours := []*string{nil, fftest.Str(store.TimeoutCancel), fftest.Str(store.TimeoutEscalate), fftest.Str(store.TimeoutAutoResume)}
	for i, ph := range phases {
		for j, b := range behaviours {
			name := ph.name + "/" + fftest.Deref(b)
			t.Run(name, func(t *testing.T) {
				p := int16(100 + 10*i + j)
				e := ph.exec
				e.Partition, e.Namespace = p, "tenant-a"
				id := fftest.InsertExec(t, pool, e)
				fftest.InsertAttempt(t, pool, p, id, 0, nil)
				fftest.InsertSuspension(t, pool, fftest.Suspension{Partition: p, ExecutionID: id, TimeoutAtMs: fftest.Ms(now - 1),
					Behavior: b, MemberMap: map[string]any{"wp-1": []any{map[string]any{"signal_name": "go"}}}})
				before, attBefore := fftest.ExecJSON(t, pool, p, id), fftest.AttemptJSON(t, pool, p, id, 0)
				susBefore := fftest.SuspensionJSON(t, pool, p, id)

				res, err := store.ExpireSuspension(ctx, pool, p, id, now, store.Filter{})
				if err != nil || res.Applied || res.NotSuspended != ph.exec.LifecyclePhase || res.DeadlineMs != 0 || res.EventID != 0 {
					t.Fatalf("result = %+v, %v; want not applied, NotSuspended %s", res, err, ph.exec.LifecyclePhase)
				}
				if after := fftest.ExecJSON(t, pool, p, id); !jsonEqual(after, before) {
					t.Fatalf("execution changed:\nbefore %v\nafter  %v", before, after)
				}
				if after := fftest.AttemptJSON(t, pool, p, id, 0); !jsonEqual(after, attBefore) {
					t.Fatalf("attempt changed:\nbefore %v\nafter  %v", attBefore, after)
				}
				if n := len(fftest.CompletionEvents(t, pool, id)); n != 0 {
					t.Fatalf("%d completion events; want 0", n)
				}
				want := withCols(susBefore, map[string]any{"timeout_at_ms": nil})
				if after := fftest.SuspensionJSON(t, pool, p, id); !jsonEqual(after, want) {
					t.Fatalf("suspension:\ngot  %v\nwant %v (only the timeout cleared)", after, want)
				}
				if rows, err := store.TimedOutSuspensions.Scan(ctx, pool, p, now+1_000_000, nil, 10, store.Filter{}); err != nil || len(rows) != 0 {
					t.Fatalf("scan after the action = %v, %v; want nothing due", rows, err)
				}
				// A second job (a retry, a rescue) finds nothing due.
				if res, err := store.ExpireSuspension(ctx, pool, p, id, now+5, store.Filter{}); err != nil || res.Applied || res.NotSuspended != "" {
					t.Fatalf("second run = %+v, %v; want a plain no-op", res, err)
				}
			})
		}
	}

	// The signal commits while the action waits for the suspension's lock
	// (deliver_signal locks it FOR UPDATE first, then writes the
	// execution): the action sees the execution as the signal left it.
	t.Run("SignalCommittedWhileWaiting", func(t *testing.T) {
		const p = int16(150)
		id := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, LifecyclePhase: "suspended", OwnershipState: "released",
			EligibilityState: "not_applicable", PublicState: "suspended", AttemptState: "attempt_interrupted"})
		fftest.InsertSuspension(t, pool, fftest.Suspension{Partition: p, ExecutionID: id, TimeoutAtMs: fftest.Ms(now - 1)})
		res := commitWhileBlocked(t, pool, "ff_suspension_current", func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT 1 FROM ff_suspension_current WHERE partition_key = $1 AND execution_id = $2 FOR UPDATE`, p, id); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `UPDATE ff_exec_core SET public_state = 'resumable', lifecycle_phase = 'runnable',
				eligibility_state = 'eligible_now' WHERE partition_key = $1 AND execution_id = $2`, p, id)
			return err
		}, func(ctx context.Context) (store.SuspensionExpireResult, error) {
			return store.ExpireSuspension(ctx, pool, p, id, now, store.Filter{})
		})
		if res.Applied || res.NotSuspended != "runnable" {
			t.Fatalf("result = %+v; want not applied, NotSuspended runnable", res)
		}
		if ex := fftest.ReadExec(t, pool, p, id); ex.LifecyclePhase != "runnable" || ex.PublicState != "resumable" {
			t.Fatalf("exec = %+v; want resumable as the signal left it", ex)
		}
		if n := len(fftest.CompletionEvents(t, pool, id)); n != 0 {
			t.Fatalf("%d completion events; want 0", n)
		}
	})
}

// TestExpireSuspensionRechecksUnderLock proves the deadline and the
// behaviour are read under the row lock: a writer holding the suspension row
// when the action starts, and committing while the action waits on the lock,
// decides what the action does, and the DeadlineMs it reports (0 when it
// does nothing).
func TestExpireSuspensionRechecksUnderLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	pool := db.Pool
	const now = int64(8_000_000)

	// hold runs change in a transaction, starts ExpireSuspension, waits until
	// it blocks on the row lock, commits, and returns its result.
	hold := func(t *testing.T, p int16, id, change string) store.SuspensionExpireResult {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck
		if _, err := tx.Exec(ctx, change, p, id); err != nil {
			t.Fatal(err)
		}
		type out struct {
			res store.SuspensionExpireResult
			err error
		}
		done := make(chan out, 1)
		go func() {
			res, err := store.ExpireSuspension(ctx, pool, p, id, now, store.Filter{})
			done <- out{res, err}
		}()
		waitForLockWait(t, pool, "ff_suspension_current")
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case o := <-done:
			if o.err != nil {
				t.Fatal(o.err)
			}
			return o.res
		case <-time.After(10 * time.Second):
			t.Fatal("action did not finish")
		}
		return store.SuspensionExpireResult{}
	}

	t.Run("ClearedTimeoutWins", func(t *testing.T) {
		id := fftest.InsertExec(t, pool, fftest.Exec{Partition: 60, LifecyclePhase: "suspended"})
		fftest.InsertSuspension(t, pool, fftest.Suspension{Partition: 60, ExecutionID: id, TimeoutAtMs: fftest.Ms(now - 1)})
		res := hold(t, 60, id, `UPDATE ff_suspension_current SET timeout_at_ms = NULL WHERE partition_key = $1 AND execution_id = $2`)
		if res.Applied || res.DeadlineMs != 0 {
			t.Fatalf("action overrode a cleared timeout: %+v; want no-op, DeadlineMs 0", res)
		}
		if ex := fftest.ReadExec(t, pool, 60, id); ex.LifecyclePhase != "suspended" {
			t.Fatalf("exec = %s; want suspended", ex.LifecyclePhase)
		}
		if n := len(fftest.CompletionEvents(t, pool, id)); n != 0 {
			t.Fatalf("%d completion events; want 0", n)
		}
	})

	t.Run("BehaviourIsReadUnderTheLock", func(t *testing.T) {
		// Scanned as fail; switched to auto-resume before the action got
		// the lock: the action must auto-resume, not fail the execution.
		id := fftest.InsertExec(t, pool, fftest.Exec{Partition: 61, LifecyclePhase: "suspended"})
		fftest.InsertSuspension(t, pool, fftest.Suspension{Partition: 61, ExecutionID: id, TimeoutAtMs: fftest.Ms(now - 1),
			Behavior: fftest.Str("fail"), MemberMap: map[string]any{"a": 1}})
		res := hold(t, 61, id, `UPDATE ff_suspension_current
			SET timeout_behavior = 'auto_resume_with_timeout_signal', member_map = '{"b": 2}'
			WHERE partition_key = $1 AND execution_id = $2`)
		// The timeout is untouched by the change: DeadlineMs is the seeded
		// one, though the auto-resume cleared it.
		if !res.Applied || res.Action != store.TimeoutAutoResume || res.TimeoutSignals != 1 || res.DeadlineMs != now-1 {
			t.Fatalf("result = %+v; want auto-resume applied, DeadlineMs %d", res, now-1)
		}
		su, ok := fftest.ReadSuspension(t, pool, 61, id)
		if !ok {
			t.Fatal("suspension deleted")
		}
		mm := su.MemberMap.(map[string]any)
		if mm["b"] == nil || mm["a"] != nil || mm["__timeout__"] == nil {
			t.Fatalf("member_map = %v; want the committed one plus __timeout__", mm)
		}
		if ex := fftest.ReadExec(t, pool, 61, id); ex.LifecyclePhase != "suspended" {
			t.Fatalf("exec = %s; want suspended", ex.LifecyclePhase)
		}
	})

	t.Run("MovedTimeoutIsTheDeadline", func(t *testing.T) {
		// Moved earlier, still due, while the action waited: the action
		// applies and reports the timeout it found under the lock, which
		// lateness is measured from, not the one the scan saw.
		id := fftest.InsertExec(t, pool, fftest.Exec{Partition: 62, LifecyclePhase: "suspended"})
		fftest.InsertSuspension(t, pool, fftest.Suspension{Partition: 62, ExecutionID: id, TimeoutAtMs: fftest.Ms(now - 1)})
		res := hold(t, 62, id, `UPDATE ff_suspension_current SET timeout_at_ms = timeout_at_ms - 9
			WHERE partition_key = $1 AND execution_id = $2`)
		if !res.Applied || res.DeadlineMs != now-10 {
			t.Fatalf("result = %+v; want applied, DeadlineMs %d (the moved timeout)", res, now-10)
		}
	})
}

// TestExpireSuspensionsBatch: a batch gives every suspension the result it
// would get alone, in input order: each terminal behaviour with its own
// event, auto-resume (with an object and a non-object member_map), a
// suspension not yet due, one already gone, one whose execution is missing,
// and an id repeated (a no-op the second time, as a second call would be),
// each applied one with its own timeout as DeadlineMs.
func TestExpireSuspensionsBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t).Pool
	const now, p = int64(7_000_000), int16(40)
	suspend := func(behavior *string, timeout int64, memberMap any) string {
		id := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, LifecyclePhase: "suspended", OwnershipState: "unowned",
			PublicState: "suspended", AttemptState: "attempt_interrupted", Namespace: "tenant-s"})
		fftest.InsertSuspension(t, pool, fftest.Suspension{Partition: p, ExecutionID: id, TimeoutAtMs: fftest.Ms(timeout),
			Behavior: behavior, MemberMap: memberMap})
		return id
	}
	cancel := suspend(fftest.Str("cancel"), now-1, nil)
	fail := suspend(nil, now-5, nil)
	resume := suspend(fftest.Str(store.TimeoutAutoResume), now-1, map[string]any{"m1": "x"})
	replaced := suspend(fftest.Str(store.TimeoutAutoResume), now-1, []int{1})
	later := suspend(fftest.Str("fail"), now+1_000, nil)
	orphan := fftest.NewUUID()
	fftest.InsertSuspension(t, pool, fftest.Suspension{Partition: p, ExecutionID: orphan, TimeoutAtMs: fftest.Ms(now - 1)})
	gone := fftest.NewUUID()

	ids := []string{cancel, fail, resume, replaced, later, orphan, gone, cancel}
	got, err := store.ExpireSuspensions(ctx, pool, p, ids, now, store.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	type want struct {
		applied       bool
		action        string
		outcome       string
		event         bool
		execMissing   bool
		signals       int
		replacedMap   bool
		behaviorEmpty bool
		deadline      int64 // the seeded timeout, when applied
	}
	wants := []want{
		{applied: true, action: "cancel", outcome: "cancelled", event: true, deadline: now - 1},
		{applied: true, action: "fail", outcome: "expired", event: true, behaviorEmpty: true, deadline: now - 5},
		{applied: true, action: store.TimeoutAutoResume, signals: 1, deadline: now - 1},
		{applied: true, action: store.TimeoutAutoResume, signals: 1, replacedMap: true, deadline: now - 1},
		{behaviorEmpty: true},
		{applied: true, action: "fail", execMissing: true, behaviorEmpty: true, deadline: now - 1},
		{behaviorEmpty: true},
		{behaviorEmpty: true}, // cancel again: the suspension is gone
	}
	for i, w := range wants {
		g := got[i]
		if g.Applied != w.applied || g.Action != w.action || g.Outcome != w.outcome || (g.EventID != 0) != w.event ||
			g.ExecMissing != w.execMissing || g.TimeoutSignals != w.signals || (g.MemberMapReplaced != "") != w.replacedMap ||
			(g.Behavior == "") != w.behaviorEmpty || g.DeadlineMs != w.deadline {
			t.Errorf("id %d (%s) = %+v, want %+v", i, ids[i], g, w)
		}
	}
	for _, c := range []struct {
		id     string
		events int
		phase  string
	}{{cancel, 1, "terminal"}, {fail, 1, "terminal"}, {resume, 0, "suspended"}, {later, 0, "suspended"}} {
		if n := len(fftest.CompletionEvents(t, pool, c.id)); n != c.events {
			t.Errorf("%s: %d completion events, want %d", c.id, n, c.events)
		}
		if ex := fftest.ReadExec(t, pool, p, c.id); ex.LifecyclePhase != c.phase {
			t.Errorf("%s: phase %s, want %s", c.id, ex.LifecyclePhase, c.phase)
		}
	}
	if evs := fftest.CompletionEvents(t, pool, cancel); len(evs) == 1 && evs[0].EventID != got[0].EventID {
		t.Errorf("cancel's event %d, result says %d", evs[0].EventID, got[0].EventID)
	}
	if su, ok := fftest.ReadSuspension(t, pool, p, resume); !ok || su.TimeoutAtMs != nil {
		t.Errorf("auto-resumed suspension = %+v, %v; want kept with its timeout cleared", su, ok)
	}
}
