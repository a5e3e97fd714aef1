package store_test

import (
	"context"
	"encoding/json"
	"maps"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
)

// withCols returns a copy of row with the given columns set.
func withCols(row map[string]any, set map[string]any) map[string]any {
	out := maps.Clone(row)
	maps.Copy(out, set)
	return out
}

// commitWhileBlocked runs change in a transaction that keeps its row locks,
// starts act, waits until act blocks on a row lock in a statement naming
// table, commits the change and returns act's result. It is the race a row
// action's re-check under its lock exists for: the change commits after the
// action's statement started and before it got the row.
func commitWhileBlocked[R any](t *testing.T, pool *pgxpool.Pool, table string,
	change func(ctx context.Context, tx pgx.Tx) error, act func(ctx context.Context) (R, error)) R {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if err := change(ctx, tx); err != nil {
		t.Fatal(err)
	}
	type out struct {
		res R
		err error
	}
	done := make(chan out, 1)
	go func() {
		res, err := act(ctx)
		done <- out{res, err}
	}()
	waitForLockWait(t, pool, table)
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
		t.Fatal("the action did not finish after the change committed")
	}
	var zero R
	return zero
}

// deadlineExpiredExec is what ExpireDeadlines makes of an execution row
// read as before: FlowFabric's four state columns, terminal_at_ms = now,
// last_failure_message merged into raw_fields, and public_state expired with
// no blocking reason (FlowFabric's Valkey engine's; its Postgres statement
// leaves them); every other column, the deadline and attempt index
// included, as it was.
func deadlineExpiredExec(before map[string]any, now int64) map[string]any {
	raw := maps.Clone(before["raw_fields"].(map[string]any))
	raw["last_failure_message"] = "execution_deadline"
	return withCols(before, map[string]any{
		"lifecycle_phase":   "terminal",
		"ownership_state":   "unowned",
		"eligibility_state": "not_applicable",
		"attempt_state":     "attempt_terminal",
		"terminal_at_ms":    float64(now),
		"public_state":      "expired",
		"blocking_reason":   nil,
		"raw_fields":        raw,
	})
}

// deadlineInterruptedAttempt is what ExpireDeadlines makes of the current
// attempt row read as before: outcome expired (FlowFabric writes
// interrupted, from which its readers derive no terminal outcome), lease
// released, terminal at now; lease_epoch, worker and the rest as they were.
func deadlineInterruptedAttempt(before map[string]any, now int64) map[string]any {
	return withCols(before, map[string]any{
		"outcome":             "expired",
		"lease_expires_at_ms": nil,
		"terminal_at_ms":      float64(now),
	})
}

// expireDeadlineOne runs ExpireDeadlines for one execution.
func expireDeadlineOne(t *testing.T, pool store.DB, p int16, id string, now int64) store.DeadlineResult {
	t.Helper()
	res, err := store.ExpireDeadlines(context.Background(), pool, p, []string{id}, now, store.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 {
		t.Fatalf("%d results for one id", len(res))
	}
	return res[0]
}

// checkDeadlineEvents checks that execution id has exactly one `expired`
// completion event and one `expired` lease event, both at now, matching res,
// with the given flow, namespace and instance tag (nil: NULL).
func checkDeadlineEvents(t *testing.T, pool store.DB, p int16, id string, res store.DeadlineResult, now int64,
	flow, namespace, tag *string) {
	t.Helper()
	eq := func(a, b *string) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }
	ces := fftest.CompletionEvents(t, pool, id)
	if len(ces) != 1 {
		t.Fatalf("%d completion events; want 1", len(ces))
	}
	ce := ces[0]
	if ce.EventID != res.CompletionEventID || ce.Partition != p || ce.ExecutionID != id || ce.Outcome != "expired" ||
		ce.OccurredAtMs != now || !eq(ce.FlowID, flow) || !eq(ce.Namespace, namespace) || !eq(ce.InstanceTag, tag) {
		t.Fatalf("completion event = %+v (result %+v); want expired at %d, flow %v, namespace %v, tag %v",
			ce, res, now, flow, namespace, tag)
	}
	les := fftest.LeaseEvents(t, pool, id)
	if len(les) != 1 {
		t.Fatalf("%d lease events; want 1", len(les))
	}
	le := les[0]
	if le.EventID != res.EventID || le.ExecutionID != id || le.EventType != "expired" || le.OccurredAtMs != now ||
		le.Partition != int32(p) || !eq(le.Namespace, namespace) || !eq(le.InstanceTag, tag) {
		t.Fatalf("lease event = %+v (result %+v); want expired at %d, partition %d, namespace %v, tag %v",
			le, res, now, p, namespace, tag)
	}
	if n := fftest.Count(t, pool, `SELECT count(*) FROM ff_lease_event WHERE event_id = $1 AND lease_id IS NULL`, le.EventID); n != 1 {
		t.Fatal("lease event has a lease_id; FlowFabric writes NULL")
	}
}

// checkNoDeadlineEvents checks that execution id has neither completion
// nor lease events.
func checkNoDeadlineEvents(t *testing.T, pool store.DB, id string) {
	t.Helper()
	if n, m := len(fftest.CompletionEvents(t, pool, id)), len(fftest.LeaseEvents(t, pool, id)); n != 0 || m != 0 {
		t.Fatalf("%d completion and %d lease events; want none", n, m)
	}
}

// TestExpireDeadlines proves ExpireDeadlines writes exactly what FlowFabric's
// expire_for_execution writes to an active execution past its deadline: the
// execution terminal (deadline_at_ms, attempt_index and every other column
// kept, raw_fields gaining last_failure_message, public_state expired), its
// current attempt ended (outcome expired) and no other, one `expired` completion event and one
// `expired` lease event, both carrying the execution's namespace and instance
// tag; that a second call changes nothing; and that it runs inside a
// caller's transaction. A regression shows as a column written or missed
// (e.g. the deadline cleared, an older attempt interrupted), an event
// missing, doubled or carrying the wrong tenant.
func TestExpireDeadlines(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t).Pool
	const now = int64(9_000_000)

	t.Run("ActiveExecutionPastItsDeadline", func(t *testing.T) {
		const p = int16(7)
		flow := fftest.NewUUID()
		id := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, FlowID: flow, AttemptIndex: 2,
			DeadlineAtMs: fftest.Ms(now - 1), Policy: map[string]any{"retry_policy": map[string]any{"max_retries": 5}},
			RawFields: map[string]any{"namespace": "tenant-a", "last_failure_message": "attempt_timeout",
				"tags": map[string]any{"cairn.instance_id": "inst-1", "other": "x"}, "progress": map[string]any{"step": 3}}})
		fftest.InsertAttempt(t, pool, p, id, 1, nil)
		// The current attempt's lease is still live: the deadline ends it
		// all the same.
		fftest.InsertAttempt(t, pool, p, id, 2, fftest.Ms(now+30_000))
		before := fftest.ExecJSON(t, pool, p, id)
		olderBefore, currentBefore := fftest.AttemptJSON(t, pool, p, id, 1), fftest.AttemptJSON(t, pool, p, id, 2)

		res := expireDeadlineOne(t, pool, p, id, now)
		if !res.Applied || !res.AttemptInterrupted || res.RawFieldsMalformed || res.EventID == 0 || res.CompletionEventID == 0 {
			t.Fatalf("result = %+v; want applied, attempt interrupted, both events", res)
		}
		after := fftest.ExecJSON(t, pool, p, id)
		if want := deadlineExpiredExec(before, now); !jsonEqual(after, want) {
			t.Fatalf("execution row:\ngot  %v\nwant %v", after, want)
		}
		if after["deadline_at_ms"] != float64(now-1) || after["attempt_index"] != float64(2) || after["public_state"] != "expired" {
			t.Fatalf("deadline %v, attempt_index %v, public_state %v; want kept, kept, expired", after["deadline_at_ms"], after["attempt_index"], after["public_state"])
		}
		if got, want := fftest.AttemptJSON(t, pool, p, id, 2), deadlineInterruptedAttempt(currentBefore, now); !jsonEqual(got, want) {
			t.Fatalf("current attempt:\ngot  %v\nwant %v", got, want)
		}
		if got := fftest.AttemptJSON(t, pool, p, id, 1); !jsonEqual(got, olderBefore) {
			t.Fatalf("older attempt changed:\ngot  %v\nwant %v", got, olderBefore)
		}
		checkDeadlineEvents(t, pool, p, id, res, now, &flow, fftest.Str("tenant-a"), fftest.Str("inst-1"))

		// A second call (the job ran twice) changes nothing: the execution is
		// terminal now.
		if res := expireDeadlineOne(t, pool, p, id, now+5); res != (store.DeadlineResult{}) {
			t.Fatalf("second call = %+v; want a no-op", res)
		}
		if again := fftest.ExecJSON(t, pool, p, id); !jsonEqual(again, after) {
			t.Fatalf("second call changed the row:\ngot  %v\nwant %v", again, after)
		}
		checkDeadlineEvents(t, pool, p, id, res, now, &flow, fftest.Str("tenant-a"), fftest.Str("inst-1"))
	})

	t.Run("WithoutItsAttemptRow", func(t *testing.T) {
		// FlowFabric accepts an execution whose current attempt row does
		// not exist (0 rows updated) and still writes both events. The
		// older attempt is not the current one and stays as it is.
		const p = int16(8)
		id := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, AttemptIndex: 1, DeadlineAtMs: fftest.Ms(now - 60_000),
			Namespace: "tenant-b"})
		fftest.InsertAttempt(t, pool, p, id, 0, fftest.Ms(now-1))
		before, olderBefore := fftest.ExecJSON(t, pool, p, id), fftest.AttemptJSON(t, pool, p, id, 0)

		res := expireDeadlineOne(t, pool, p, id, now)
		if !res.Applied || res.AttemptInterrupted || res.RawFieldsMalformed || res.EventID == 0 || res.CompletionEventID == 0 {
			t.Fatalf("result = %+v; want applied without an attempt interrupted, both events", res)
		}
		if got, want := fftest.ExecJSON(t, pool, p, id), deadlineExpiredExec(before, now); !jsonEqual(got, want) {
			t.Fatalf("execution row:\ngot  %v\nwant %v", got, want)
		}
		if got := fftest.AttemptJSON(t, pool, p, id, 0); !jsonEqual(got, olderBefore) {
			t.Fatalf("older attempt changed:\ngot  %v\nwant %v", got, olderBefore)
		}
		// No flow: the completion event's flow_id is NULL; no tag: NULL.
		checkDeadlineEvents(t, pool, p, id, res, now, nil, fftest.Str("tenant-b"), nil)
	})

	t.Run("InTheCallersTransaction", func(t *testing.T) {
		// db may be a transaction: the statement and its lock statement
		// run in it, and roll back with it.
		const p = int16(10)
		id := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, DeadlineAtMs: fftest.Ms(now - 1)})
		fftest.InsertAttempt(t, pool, p, id, 0, fftest.Ms(now+1_000))
		before := fftest.ExecJSON(t, pool, p, id)
		ctx := context.Background()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck
		if res := expireDeadlineOne(t, tx, p, id, now); !res.Applied || !res.AttemptInterrupted {
			t.Fatalf("result = %+v; want applied", res)
		}
		if ex := fftest.ReadExec(t, tx, p, id); ex.LifecyclePhase != "terminal" {
			t.Fatalf("phase in the transaction = %s; want terminal", ex.LifecyclePhase)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if after := fftest.ExecJSON(t, pool, p, id); !jsonEqual(after, before) {
			t.Fatalf("rolled back, yet the execution changed:\nbefore %v\nafter  %v", before, after)
		}
		checkNoDeadlineEvents(t, pool, id)
	})

	t.Run("InvalidIDIsAnError", func(t *testing.T) {
		if res, err := store.ExpireDeadlines(context.Background(), pool, 10, []string{"not-a-uuid"}, now, store.Filter{}); err == nil {
			t.Fatalf("result = %+v; want an error", res)
		}
	})

	// raw_fields that is not a JSON object is kept as it is (FlowFabric's
	// || would turn it into an array) and reported; the rest is applied,
	// and the events carry no tenant (there is none to read).
	malformed := []struct {
		name string
		raw  any
		text string
	}{
		{name: "Array", raw: []any{"x", 1}, text: `["x", 1]`},
		{name: "String", raw: "not an object", text: `"not an object"`},
		{name: "JSONNull", raw: json.RawMessage(`null`), text: `null`},
		{name: "Number", raw: 42, text: `42`},
	}
	for _, tt := range malformed {
		t.Run("MalformedRawFieldsAreKept/"+tt.name, func(t *testing.T) {
			const p = int16(9)
			id := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, DeadlineAtMs: fftest.Ms(now - 1), RawFields: tt.raw})
			fftest.InsertAttempt(t, pool, p, id, 0, fftest.Ms(now+1_000))
			before := fftest.ExecJSON(t, pool, p, id)
			res := expireDeadlineOne(t, pool, p, id, now)
			if !res.Applied || !res.AttemptInterrupted || !res.RawFieldsMalformed {
				t.Fatalf("result = %+v; want applied, attempt interrupted, raw_fields malformed", res)
			}
			want := deadlineExpiredExec(withCols(before, map[string]any{"raw_fields": map[string]any{}}), now)
			want["raw_fields"] = before["raw_fields"]
			if got := fftest.ExecJSON(t, pool, p, id); !jsonEqual(got, want) {
				t.Fatalf("execution row:\ngot  %v\nwant %v", got, want)
			}
			if ex := fftest.ReadExec(t, pool, p, id); ex.RawFieldsText != tt.text {
				t.Fatalf("raw_fields = %s; want %s kept", ex.RawFieldsText, tt.text)
			}
			checkDeadlineEvents(t, pool, p, id, res, now, nil, nil, nil)
		})
	}
}

// TestExpireDeadlinesNoOps proves every guard of expire_for_execution: an
// execution that is not active (a delayed one, whose deadline_at_ms holds
// its passed delay-until; a terminal or a suspended one), whose deadline is
// ahead, exactly now (FlowFabric's strict <) or NULL, or that does not exist
// in the partition asked for, is left exactly as it is, its attempt too, and
// gets no event. A regression (e.g. the phase condition dropped, which would
// fail every delayed execution at its delay-until) shows as a changed row or
// an event.
func TestExpireDeadlinesNoOps(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t).Pool
	const now = int64(9_000_000)
	const p = int16(12)

	tests := []struct {
		name string
		exec *fftest.Exec // nil: no execution row
		call int16        // partition to call with (default p)
	}{
		{name: "DelayedPastItsDelayUntil", exec: func() *fftest.Exec { e := fftest.Delayed(p, now-10); return &e }()},
		{name: "Terminal", exec: &fftest.Exec{Partition: p, LifecyclePhase: "terminal", OwnershipState: "unowned",
			PublicState: "completed", AttemptState: "attempt_terminal", DeadlineAtMs: fftest.Ms(now - 10)}},
		{name: "Suspended", exec: &fftest.Exec{Partition: p, LifecyclePhase: "suspended", OwnershipState: "unowned",
			PublicState: "suspended", AttemptState: "attempt_interrupted", DeadlineAtMs: fftest.Ms(now - 10)}},
		{name: "RunnableEligible", exec: &fftest.Exec{Partition: p, LifecyclePhase: "runnable", OwnershipState: "unowned",
			EligibilityState: "eligible_now", PublicState: "waiting", AttemptState: "pending_first_attempt", DeadlineAtMs: fftest.Ms(now - 10)}},
		{name: "DeadlineAhead", exec: &fftest.Exec{Partition: p, DeadlineAtMs: fftest.Ms(now + 1)}},
		{name: "DeadlineIsNow", exec: &fftest.Exec{Partition: p, DeadlineAtMs: fftest.Ms(now)}},
		{name: "DeadlineNull", exec: &fftest.Exec{Partition: p}},
		{name: "OtherPartition", exec: &fftest.Exec{Partition: p, DeadlineAtMs: fftest.Ms(now - 10)}, call: p + 1},
		{name: "Missing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := fftest.NewUUID()
			var before, attBefore map[string]any
			if tt.exec != nil {
				e := *tt.exec
				e.ID = id
				fftest.InsertExec(t, pool, e)
				before = fftest.ExecJSON(t, pool, p, id)
			}
			fftest.InsertAttempt(t, pool, p, id, 0, fftest.Ms(now+1_000))
			attBefore = fftest.AttemptJSON(t, pool, p, id, 0)
			call := tt.call
			if call == 0 {
				call = p
			}

			if res := expireDeadlineOne(t, pool, call, id, now); res != (store.DeadlineResult{}) {
				t.Fatalf("result = %+v; want a no-op", res)
			}
			if tt.exec != nil {
				if after := fftest.ExecJSON(t, pool, p, id); !jsonEqual(after, before) {
					t.Fatalf("execution changed:\nbefore %v\nafter  %v", before, after)
				}
			}
			if after := fftest.AttemptJSON(t, pool, p, id, 0); !jsonEqual(after, attBefore) {
				t.Fatalf("attempt changed:\nbefore %v\nafter  %v", attBefore, after)
			}
			checkNoDeadlineEvents(t, pool, id)
		})
	}
}

// TestExpireDeadlinesRechecksUnderLock proves the execution is re-checked,
// and everything written is read, under its row lock: a transaction that
// holds the execution when ExpireDeadlines starts and commits while it waits
// decides the outcome. A completion or a moved or cleared deadline wins (no
// change, no event) instead of being overwritten by a stale decision; a
// raw_fields change is merged into, not lost, and its tenant is the events';
// a new current attempt (a reclaim: attempt_index moved on, its attempt row
// inserted) is the one interrupted, as FlowFabric's UPDATE, a statement of
// its own after the lock, does. A regression shows as a terminal row that
// was completed or re-deadlined, a lost raw_fields key, or a live lease left
// on the new attempt of a terminal execution.
func TestExpireDeadlinesRechecksUnderLock(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t).Pool
	const now = int64(9_000_000)
	const p = int16(21)

	tests := []struct {
		name    string
		change  string // @p partition, @id execution id, @now now
		applied bool
		check   func(t *testing.T, id string, res store.DeadlineResult)
	}{
		{name: "CompletedMeanwhile", change: `UPDATE ff_exec_core SET lifecycle_phase = 'terminal', ownership_state = 'unowned',
			public_state = 'completed', attempt_state = 'attempt_terminal', terminal_at_ms = @now - 1
			WHERE partition_key = @p AND execution_id = @id`},
		{name: "DeadlineMovedMeanwhile", change: `UPDATE ff_exec_core SET deadline_at_ms = @now + 60000
			WHERE partition_key = @p AND execution_id = @id`},
		{name: "DeadlineClearedMeanwhile", change: `UPDATE ff_exec_core SET deadline_at_ms = NULL
			WHERE partition_key = @p AND execution_id = @id`},
		{name: "RawFieldsChangedMeanwhile", applied: true,
			change: `UPDATE ff_exec_core SET raw_fields = raw_fields || '{"namespace": "tenant-b", "progress": 7}'
			WHERE partition_key = @p AND execution_id = @id`,
			check: func(t *testing.T, id string, res store.DeadlineResult) {
				raw := fftest.ReadExec(t, pool, p, id).RawFields
				if raw["namespace"] != "tenant-b" || raw["progress"] != float64(7) || raw["last_failure_message"] != "execution_deadline" {
					t.Fatalf("raw_fields = %v; want the committed change plus last_failure_message", raw)
				}
				checkDeadlineEvents(t, pool, p, id, res, now, nil, fftest.Str("tenant-b"), fftest.Str("inst-1"))
			}},
		{name: "NewAttemptMeanwhile", applied: true,
			change: `WITH a AS (
				INSERT INTO ff_attempt (partition_key, execution_id, attempt_index, worker_id, lease_epoch, lease_expires_at_ms, started_at_ms)
				VALUES (@p, @id, 1, 'w2', 1, @now + 30000, @now - 1))
			UPDATE ff_exec_core SET attempt_index = 1 WHERE partition_key = @p AND execution_id = @id`,
			check: func(t *testing.T, id string, res store.DeadlineResult) {
				if !res.AttemptInterrupted {
					t.Errorf("result = %+v; want the new current attempt interrupted", res)
				}
				if att := fftest.AttemptJSON(t, pool, p, id, 1); att["outcome"] != "expired" ||
					att["lease_expires_at_ms"] != nil || att["terminal_at_ms"] != float64(now) {
					t.Errorf("new current attempt = %v; want expired, lease NULL, terminal at now", att)
				}
				if att := fftest.AttemptJSON(t, pool, p, id, 0); att["outcome"] != nil || att["lease_expires_at_ms"] != float64(now+1_000) {
					t.Errorf("old attempt = %v; want untouched", att)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, DeadlineAtMs: fftest.Ms(now - 1), Namespace: "tenant-a",
				Tags: map[string]string{"cairn.instance_id": "inst-1"}})
			fftest.InsertAttempt(t, pool, p, id, 0, fftest.Ms(now+1_000))
			attBefore := fftest.AttemptJSON(t, pool, p, id, 0)

			var committed map[string]any
			res := commitWhileBlocked(t, pool, "ff_exec_core", func(ctx context.Context, tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, tt.change, pgx.NamedArgs{"p": p, "id": id, "now": now}); err != nil {
					return err
				}
				committed = fftest.ExecJSON(t, tx, p, id)
				return nil
			}, func(ctx context.Context) (store.DeadlineResult, error) {
				res, err := store.ExpireDeadlines(ctx, pool, p, []string{id}, now, store.Filter{})
				if err != nil {
					return store.DeadlineResult{}, err
				}
				return res[0], nil
			})
			if res.Applied != tt.applied {
				t.Fatalf("result = %+v; want applied %v", res, tt.applied)
			}
			if !tt.applied {
				if res != (store.DeadlineResult{}) {
					t.Fatalf("result = %+v; want a no-op", res)
				}
				if after := fftest.ExecJSON(t, pool, p, id); !jsonEqual(after, committed) {
					t.Fatalf("execution is not as the change committed it:\ngot  %v\nwant %v", after, committed)
				}
				if after := fftest.AttemptJSON(t, pool, p, id, 0); !jsonEqual(after, attBefore) {
					t.Fatalf("attempt changed:\nbefore %v\nafter  %v", attBefore, after)
				}
				checkNoDeadlineEvents(t, pool, id)
				return
			}
			if after, want := fftest.ExecJSON(t, pool, p, id), deadlineExpiredExec(committed, now); !jsonEqual(after, want) {
				t.Fatalf("execution row:\ngot  %v\nwant %v", after, want)
			}
			tt.check(t, id, res)
		})
	}
}

// TestExpireDeadlinesBatch proves a batch gives every id the result it gets
// alone, in input order: applied ones with their own events and tenant, one
// without its attempt row, one with malformed raw_fields, no-ops (delayed,
// deadline ahead, missing) in between, and an id repeated, a no-op the
// second time as a second call would be (no second event). A regression
// shows as results shifted between ids, a repeated id applied twice, an
// event written for the wrong execution, or a DeadlineMs other than the
// execution's own deadline.
func TestExpireDeadlinesBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t).Pool
	const now, p = int64(9_000_000), int16(33)

	a := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, DeadlineAtMs: fftest.Ms(now - 1), Namespace: "tenant-a",
		Tags: map[string]string{"cairn.instance_id": "i-a"}})
	fftest.InsertAttempt(t, pool, p, a, 0, fftest.Ms(now+1_000))
	b := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, AttemptIndex: 3, DeadlineAtMs: fftest.Ms(now - 100), Namespace: "tenant-b"})
	delayed := fftest.InsertExec(t, pool, fftest.Delayed(p, now-1))
	ahead := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, DeadlineAtMs: fftest.Ms(now + 1_000)})
	fftest.InsertAttempt(t, pool, p, ahead, 0, fftest.Ms(now+1_000))
	missing := fftest.NewUUID()
	malformed := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, DeadlineAtMs: fftest.Ms(now - 1), RawFields: []int{1}})
	fftest.InsertAttempt(t, pool, p, malformed, 0, fftest.Ms(now+1_000))
	c := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, AttemptIndex: 1, DeadlineAtMs: fftest.Ms(now - 5), Namespace: "tenant-c"})
	fftest.InsertAttempt(t, pool, p, c, 0, nil)
	fftest.InsertAttempt(t, pool, p, c, 1, fftest.Ms(now+1_000))
	untouched := map[string]map[string]any{}
	for _, id := range []string{delayed, ahead} {
		untouched[id] = fftest.ExecJSON(t, pool, p, id)
	}

	ids := []string{a, delayed, b, ahead, missing, malformed, a, c}
	got, err := store.ExpireDeadlines(ctx, pool, p, ids, now, store.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	want := []store.DeadlineResult{
		{Applied: true, AttemptInterrupted: true, DeadlineMs: now - 1},
		{},
		{Applied: true, DeadlineMs: now - 100},
		{},
		{},
		{Applied: true, AttemptInterrupted: true, RawFieldsMalformed: true, DeadlineMs: now - 1},
		{}, // a again: terminal since the first
		{Applied: true, AttemptInterrupted: true, DeadlineMs: now - 5},
	}
	if len(got) != len(want) {
		t.Fatalf("%d results for %d ids", len(got), len(ids))
	}
	for i := range want {
		g := got[i]
		if g.Applied != (g.EventID != 0) || g.Applied != (g.CompletionEventID != 0) {
			t.Errorf("id %d: applied %v with events %d/%d", i, g.Applied, g.EventID, g.CompletionEventID)
		}
		g.EventID, g.CompletionEventID = 0, 0
		if g != want[i] {
			t.Errorf("id %d (%s) = %+v, want %+v", i, ids[i], g, want[i])
		}
	}
	checkDeadlineEvents(t, pool, p, a, got[0], now, nil, fftest.Str("tenant-a"), fftest.Str("i-a"))
	checkDeadlineEvents(t, pool, p, b, got[2], now, nil, fftest.Str("tenant-b"), nil)
	checkDeadlineEvents(t, pool, p, malformed, got[5], now, nil, nil, nil)
	checkDeadlineEvents(t, pool, p, c, got[7], now, nil, fftest.Str("tenant-c"), nil)
	if att := fftest.AttemptJSON(t, pool, p, c, 0); att["outcome"] != nil || att["terminal_at_ms"] != nil {
		t.Errorf("c's older attempt = %v; want untouched", att)
	}
	for id, before := range untouched {
		if after := fftest.ExecJSON(t, pool, p, id); !jsonEqual(after, before) {
			t.Errorf("%s changed:\nbefore %v\nafter  %v", id, before, after)
		}
		checkNoDeadlineEvents(t, pool, id)
	}
	if att := fftest.AttemptJSON(t, pool, p, ahead, 0); att["outcome"] != nil || att["lease_expires_at_ms"] != float64(now+1_000) {
		t.Errorf("attempt of the execution not due = %v; want untouched", att)
	}
}
