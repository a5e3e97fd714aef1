package store_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
)

// TestExpireAttempts checks FlowFabric's attempt_timeout expire_one, row by
// row: an attempt whose lease lapsed on an active execution is interrupted,
// and the execution retried (the next attempt index, no completion event)
// while its attempt_index is below its policy's max_retries, else terminal
// with an `expired` completion event; both write one `expired` lease event,
// and a second run changes nothing. A regression shows as a value FlowFabric
// does not write (or one it writes left out), an event too many or missing,
// an action on a row FlowFabric leaves alone, or a DeadlineMs other than the
// expiry of the lease interrupted (0: read after the statement cleared it).
func TestExpireAttempts(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t).Pool
	const now = int64(4_000_000)
	tenant := func(e fftest.Exec) fftest.Exec {
		e.Namespace, e.Tags = "tenant-a", map[string]string{"cairn.instance_id": "inst-1"}
		e.FlowID = fftest.NewUUID()
		return e
	}

	t.Run("RetriesRemain", func(t *testing.T) {
		id := fftest.InsertExec(t, pool, tenant(fftest.Exec{Partition: 7, AttemptIndex: 1,
			Policy: map[string]any{"retry_policy": map[string]any{"max_retries": 3}}}))
		fftest.InsertAttempt(t, pool, 7, id, 1, fftest.Ms(now-1))
		before := fftest.ExecJSON(t, pool, 7, id)

		res := expireOne(t, pool, 7, id, 1, now)
		if !res.Applied || !res.Retried || res.CompletionEventID != 0 || res.EventID == 0 || res.RawFieldsMalformed || res.PolicyMalformed != "" {
			t.Fatalf("result = %+v; want applied, retried, a lease event and no completion event", res)
		}
		// The statement clears lease_expires_at_ms: DeadlineMs is the
		// expiry it had (seeded at now - 1), read before, not the NULL after.
		if res.DeadlineMs != now-1 {
			t.Fatalf("DeadlineMs = %d; want the interrupted lease's expiry %d", res.DeadlineMs, now-1)
		}
		checkInterrupted(t, pool, 7, id, 1, now, "interrupted")
		after := fftest.ExecJSON(t, pool, 7, id)
		want := map[string]any{"lifecycle_phase": "runnable", "ownership_state": "unowned",
			"eligibility_state": "eligible_now", "attempt_state": "pending_retry_attempt", "attempt_index": float64(2),
			"public_state": "waiting", "blocking_reason": "waiting_for_worker"}
		checkExecChanged(t, before, after, want, "attempt_timeout")
		if evs := fftest.CompletionEvents(t, pool, id); len(evs) != 0 {
			t.Fatalf("completion events %+v; want none while retries remain", evs)
		}
		checkOneLeaseEvent(t, pool, 7, id, res.EventID, now)
		if res := expireOne(t, pool, 7, id, 1, now+5); res.Applied || res.DeadlineMs != 0 {
			t.Fatalf("second run = %+v; want no-op, DeadlineMs 0", res)
		}
		if n := len(fftest.LeaseEvents(t, pool, id)); n != 1 {
			t.Fatalf("%d lease events after a second run; want 1", n)
		}
	})

	t.Run("RetriesExhausted", func(t *testing.T) {
		id := fftest.InsertExec(t, pool, tenant(fftest.Exec{Partition: 8, AttemptIndex: 3,
			Policy: map[string]any{"retry_policy": map[string]any{"max_retries": 3}}}))
		fftest.InsertAttempt(t, pool, 8, id, 3, fftest.Ms(now-1))
		before := fftest.ExecJSON(t, pool, 8, id)

		res := expireOne(t, pool, 8, id, 3, now)
		if !res.Applied || res.Retried || res.CompletionEventID == 0 || res.EventID == 0 {
			t.Fatalf("result = %+v; want applied, terminal, both events", res)
		}
		checkInterrupted(t, pool, 8, id, 3, now, "expired")
		checkExecChanged(t, before, fftest.ExecJSON(t, pool, 8, id), map[string]any{"lifecycle_phase": "terminal",
			"ownership_state": "unowned", "eligibility_state": "not_applicable", "attempt_state": "attempt_terminal",
			"terminal_at_ms": float64(now), "public_state": "expired", "blocking_reason": nil}, "attempt_timeout")
		evs := fftest.CompletionEvents(t, pool, id)
		if len(evs) != 1 || evs[0].Outcome != "expired" || evs[0].OccurredAtMs != now || evs[0].EventID != res.CompletionEventID ||
			evs[0].FlowID == nil || *evs[0].FlowID != before["flow_id"] ||
			evs[0].Namespace == nil || *evs[0].Namespace != "tenant-a" || evs[0].InstanceTag == nil || *evs[0].InstanceTag != "inst-1" {
			t.Fatalf("completion events = %+v; want one expired, flow copied, at now, with namespace and tag", evs)
		}
		checkOneLeaseEvent(t, pool, 8, id, res.EventID, now)
	})

	t.Run("OlderAttemptRetriesOnTheExecutionsIndex", func(t *testing.T) {
		// The scanned attempt is 0, the execution is on attempt 1 of 2
		// retries: FlowFabric decides on the execution's index (retry to
		// 2) and interrupts the scanned attempt, leaving attempt 1 alone.
		id := fftest.InsertExec(t, pool, fftest.Exec{Partition: 9, AttemptIndex: 1,
			Policy: map[string]any{"retry_policy": map[string]any{"max_retries": 2}}})
		fftest.InsertAttempt(t, pool, 9, id, 0, fftest.Ms(now-5))
		fftest.InsertAttempt(t, pool, 9, id, 1, fftest.Ms(now+60_000))
		// DeadlineMs is the scanned attempt's expiry, not the current one's.
		if res := expireOne(t, pool, 9, id, 0, now); !res.Applied || !res.Retried || res.DeadlineMs != now-5 {
			t.Fatalf("result = %+v; want applied and retried, DeadlineMs %d", res, now-5)
		}
		if ex := fftest.ExecJSON(t, pool, 9, id); ex["attempt_index"] != float64(2) {
			t.Fatalf("attempt_index = %v; want 2", ex["attempt_index"])
		}
		if att := fftest.ReadAttempt(t, pool, 9, id, 1); att.LeaseExpiresAtMs == nil || att.Outcome != nil {
			t.Fatalf("attempt 1 = %+v; want untouched", att)
		}
	})

	t.Run("OlderAttemptEndingTheExecutionEndsItsCurrentAttemptToo", func(t *testing.T) {
		// Retries spent on the execution's index (1 of 1): the scanned
		// attempt 0 is interrupted as FlowFabric does, and the current
		// attempt 1, which FlowFabric's read_execution_info derives the
		// terminal outcome from, says expired; its lease is left to lease
		// expiry.
		id := fftest.InsertExec(t, pool, fftest.Exec{Partition: 10, AttemptIndex: 1,
			Policy: map[string]any{"retry_policy": map[string]any{"max_retries": 1}}})
		fftest.InsertAttempt(t, pool, 10, id, 0, fftest.Ms(now-5))
		fftest.InsertAttempt(t, pool, 10, id, 1, fftest.Ms(now+60_000))
		if res := expireOne(t, pool, 10, id, 0, now); !res.Applied || res.Retried {
			t.Fatalf("result = %+v; want applied, terminal", res)
		}
		checkInterrupted(t, pool, 10, id, 0, now, "expired")
		if att := fftest.ReadAttempt(t, pool, 10, id, 1); att.LeaseExpiresAtMs == nil || *att.LeaseExpiresAtMs != now+60_000 ||
			fftest.Deref(att.Outcome) != "expired" {
			t.Fatalf("attempt 1 = lease %v, outcome %s; want its lease kept, outcome expired", att.LeaseExpiresAtMs, fftest.Deref(att.Outcome))
		}
	})

	// max_retries as FlowFabric's extract_max_retries reads it: a JSON
	// unsigned integer that fits 32 bits, else 0.
	for i, tt := range []struct {
		name   string
		policy any
		retry  bool
		bad    string
	}{
		{"NoPolicy", nil, false, ""},
		{"NoRetryPolicy", map[string]any{"other": 1}, false, ""},
		{"Zero", map[string]any{"retry_policy": map[string]any{"max_retries": 0}}, false, ""},
		{"One", map[string]any{"retry_policy": map[string]any{"max_retries": 1}}, true, ""},
		{"Largest", map[string]any{"retry_policy": map[string]any{"max_retries": 4294967295}}, true, ""},
		{"TooLarge", map[string]any{"retry_policy": map[string]any{"max_retries": 4294967296}}, false, "4294967296"},
		{"Negative", map[string]any{"retry_policy": map[string]any{"max_retries": -2}}, false, "-2"},
		{"Fraction", map[string]any{"retry_policy": map[string]any{"max_retries": 2.5}}, false, "2.5"},
		{"String", map[string]any{"retry_policy": map[string]any{"max_retries": "3"}}, false, `"3"`},
		{"Null", map[string]any{"retry_policy": map[string]any{"max_retries": nil}}, false, "null"},
		{"PolicyNotAnObject", []any{1, 2}, false, ""},
	} {
		t.Run("MaxRetries"+tt.name, func(t *testing.T) {
			p := int16(20 + i)
			id := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, Policy: tt.policy})
			fftest.InsertAttempt(t, pool, p, id, 0, fftest.Ms(now-1))
			res := expireOne(t, pool, p, id, 0, now)
			if !res.Applied || res.Retried != tt.retry || res.PolicyMalformed != tt.bad {
				t.Fatalf("result = %+v; want applied, retried %v, malformed %q", res, tt.retry, tt.bad)
			}
		})
	}

	for i, tt := range []struct {
		name  string
		exec  *fftest.Exec // nil: no execution row
		lease *int64
	}{
		{"LeaseNotExpired", &fftest.Exec{}, fftest.Ms(now + 1)},
		{"LeaseExpiresNow", &fftest.Exec{}, fftest.Ms(now)},
		{"LeaseReleased", &fftest.Exec{}, nil},
		{"ExecutionNotActive", &fftest.Exec{LifecyclePhase: "runnable", OwnershipState: "unowned"}, fftest.Ms(now - 1)},
		{"ExecutionTerminal", &fftest.Exec{LifecyclePhase: "terminal", OwnershipState: "unowned"}, fftest.Ms(now - 1)},
		{"ExecutionMissing", nil, fftest.Ms(now - 1)},
	} {
		t.Run("NoOp"+tt.name, func(t *testing.T) {
			p := int16(40 + i)
			id := fftest.NewUUID()
			if tt.exec != nil {
				e := *tt.exec
				e.Partition, e.ID = p, id
				fftest.InsertExec(t, pool, e)
			}
			fftest.InsertAttempt(t, pool, p, id, 0, tt.lease)
			// DeadlineMs 0 even where the lease did lapse (the execution
			// not active): nothing applied.
			if res := expireOne(t, pool, p, id, 0, now); res.Applied || res.DeadlineMs != 0 {
				t.Fatalf("result = %+v; want no-op, DeadlineMs 0", res)
			}
			att := fftest.ReadAttempt(t, pool, p, id, 0)
			if (tt.lease == nil) != (att.LeaseExpiresAtMs == nil) || att.Outcome != nil {
				t.Fatalf("attempt changed: %+v", att)
			}
			if n := len(fftest.LeaseEvents(t, pool, id)); n != 0 {
				t.Fatalf("%d lease events; want 0", n)
			}
		})
	}

	t.Run("MalformedRawFieldsAreKept", func(t *testing.T) {
		id := fftest.InsertExec(t, pool, fftest.Exec{Partition: 60, RawFields: []any{"x"}})
		fftest.InsertAttempt(t, pool, 60, id, 0, fftest.Ms(now-1))
		res := expireOne(t, pool, 60, id, 0, now)
		if !res.Applied || !res.RawFieldsMalformed {
			t.Fatalf("result = %+v; want applied, raw_fields malformed", res)
		}
		if ex := fftest.ReadExec(t, pool, 60, id); ex.RawFieldsText != `["x"]` || ex.LifecyclePhase != "terminal" {
			t.Fatalf("exec = %+v; want terminal with raw_fields kept", ex)
		}
	})
}

// TestExpireAttemptsBatch: a batch gives every attempt the result it gets
// alone, in input order, and a second attempt of an execution already in
// the batch goes to a following statement, where it finds the execution no
// longer active: a no-op, exactly as in FlowFabric's sequential loop. A
// regression (both attempts in one statement) would apply the second one to
// the execution as it was before the first; another would give an attempt
// another's DeadlineMs, or one to a no-op.
func TestExpireAttemptsBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t).Pool
	const now, p = int64(5_000_000), int16(13)
	retry := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, Policy: map[string]any{"retry_policy": map[string]any{"max_retries": 5}}})
	fftest.InsertAttempt(t, pool, p, retry, 0, fftest.Ms(now-3))
	term := fftest.InsertExec(t, pool, fftest.Exec{Partition: p})
	fftest.InsertAttempt(t, pool, p, term, 0, fftest.Ms(now-2))
	fftest.InsertAttempt(t, pool, p, term, 1, fftest.Ms(now-1))
	later := fftest.InsertExec(t, pool, fftest.Exec{Partition: p})
	fftest.InsertAttempt(t, pool, p, later, 0, fftest.Ms(now+1000))

	refs := []store.LeaseRef{{ExecutionID: retry}, {ExecutionID: term}, {ExecutionID: later}, {ExecutionID: term, AttemptIndex: 1}, {ExecutionID: fftest.NewUUID()}}
	res, err := store.ExpireAttempts(ctx, pool, p, refs, now, store.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	// deadline is an applied attempt's own seeded expiry; the second attempt
	// of term lapsed too, but is a no-op: 0.
	want := []struct {
		applied, retried bool
		deadline         int64
	}{{true, true, now - 3}, {true, false, now - 2}, {false, false, 0}, {false, false, 0}, {false, false, 0}}
	for i, w := range want {
		if res[i].Applied != w.applied || res[i].Retried != w.retried || res[i].DeadlineMs != w.deadline {
			t.Errorf("result %d (%s) = %+v; want applied %v, retried %v, DeadlineMs %d", i, refs[i].ExecutionID, res[i], w.applied, w.retried, w.deadline)
		}
	}
	if att := fftest.ReadAttempt(t, pool, p, term, 1); att.LeaseExpiresAtMs == nil {
		t.Error("the second attempt of an execution made terminal by the first was interrupted")
	}
	if n := fftest.Count(t, pool, `SELECT count(*) FROM ff_lease_event WHERE partition_key = $1`, p); n != 2 {
		t.Errorf("%d lease events; want 2", n)
	}
}

// TestExpireAttemptRechecksUnderLock: a renewal holding the attempt row when
// the timeout starts, committing while it waits on the lock, wins; the
// timeout changes nothing. Without the re-check under the lock, a renewed
// lease would be interrupted, or its new expiry reported as DeadlineMs.
func TestExpireAttemptRechecksUnderLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t).Pool
	const now = int64(2_000_000)
	id := fftest.InsertExec(t, pool, fftest.Exec{Partition: 9})
	fftest.InsertAttempt(t, pool, 9, id, 0, fftest.Ms(now-1))

	renew, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer renew.Rollback(ctx) //nolint:errcheck // committed below
	if _, err := renew.Exec(ctx, `UPDATE ff_attempt SET lease_expires_at_ms = $1 WHERE partition_key = 9 AND execution_id = $2`,
		now+30_000, id); err != nil {
		t.Fatal(err)
	}
	done := make(chan []store.AttemptTimeoutResult, 1)
	errc := make(chan error, 1)
	go func() {
		res, err := store.ExpireAttempts(ctx, pool, 9, []store.LeaseRef{{ExecutionID: id}}, now, store.Filter{})
		if err != nil {
			errc <- err
			return
		}
		done <- res
	}()
	waitForLockWait(t, pool, "ff_attempt")
	if err := renew.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case res := <-done:
		if res[0].Applied {
			t.Fatalf("the timeout interrupted a renewed lease: %+v", res[0])
		}
		if res[0].DeadlineMs != 0 {
			t.Fatalf("DeadlineMs = %d; want 0, nothing interrupted", res[0].DeadlineMs)
		}
	case err := <-errc:
		t.Fatal(err)
	case <-time.After(10 * time.Second):
		t.Fatal("the timeout did not finish")
	}
	if ex := fftest.ReadExec(t, pool, 9, id); ex.LifecyclePhase != "active" {
		t.Fatalf("execution changed: %+v", ex)
	}
}

// TestAttemptTimeoutAndLeaseExpiryRace: an expired lease on an active
// execution is due for both attempt timeout and lease expiry, as in
// FlowFabric, where both loops race for it. Offered to both at the same
// instant, each row gets exactly one of the two actions, whole: either
// lease expiry's (attempt lease_expired_reclaimable, execution
// attempt_interrupted, attempt index unchanged) or attempt timeout's
// (attempt interrupted, execution pending_retry_attempt with the next index),
// with one lease event. A regression would show both actions on one row
// (two events, an attempt of one with an execution of the other), or none.
func TestAttemptTimeoutAndLeaseExpiryRace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t).Pool
	const rows, p = 60, int16(17)
	now := store.NowMs()
	ids := make([]string, rows)
	for i := range ids {
		ids[i] = fftest.InsertExec(t, pool, fftest.Exec{Partition: p,
			Policy: map[string]any{"retry_policy": map[string]any{"max_retries": 2}}})
		fftest.InsertAttempt(t, pool, p, ids[i], 0, fftest.Ms(now-1))
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2*rows)
	for _, id := range ids {
		start := make(chan struct{})
		wg.Go(func() {
			<-start
			_, err := store.ReleaseExpiredLease(ctx, pool, p, id, 0, now, store.Filter{})
			errs <- err
		})
		wg.Go(func() {
			<-start
			_, err := store.ExpireAttempts(ctx, pool, p, []store.LeaseRef{{ExecutionID: id}}, now, store.Filter{})
			errs <- err
		})
		close(start)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	byTimeout, byExpiry := 0, 0
	for _, id := range ids {
		att := fftest.ReadAttempt(t, pool, p, id, 0)
		ex := fftest.ExecJSON(t, pool, p, id)
		outcome := fmt.Sprint(deref(att.Outcome), "/", ex["attempt_state"], "/", ex["attempt_index"])
		switch outcome {
		case "interrupted/pending_retry_attempt/1":
			byTimeout++
		case "lease_expired_reclaimable/attempt_interrupted/0":
			byExpiry++
		default:
			t.Errorf("execution %s: attempt/execution = %s; want one reconciler's whole action", id, outcome)
		}
		if att.LeaseExpiresAtMs != nil {
			t.Errorf("execution %s: lease not released", id)
		}
		if n := len(fftest.LeaseEvents(t, pool, id)); n != 1 {
			t.Errorf("execution %s: %d lease events; want 1", id, n)
		}
	}
	t.Logf("attempt timeout won %d rows, lease expiry %d", byTimeout, byExpiry)
}

func deref(s *string) string {
	if s == nil {
		return "NULL"
	}
	return *s
}

func expireOne(t *testing.T, db store.DB, p int16, id string, attempt int32, now int64) store.AttemptTimeoutResult {
	t.Helper()
	res, err := store.ExpireAttempts(context.Background(), db, p, []store.LeaseRef{{ExecutionID: id, AttemptIndex: attempt}}, now, store.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	return res[0]
}

// checkInterrupted checks an attempt as FlowFabric's timeout leaves it.
func checkInterrupted(t *testing.T, db store.DB, p int16, id string, attempt int32, now int64, outcome string) {
	t.Helper()
	var got *string
	var lease, terminal *int64
	if err := db.QueryRow(context.Background(), `SELECT outcome, lease_expires_at_ms, terminal_at_ms FROM ff_attempt
		WHERE partition_key = $1 AND execution_id = $2 AND attempt_index = $3`, p, id, attempt).Scan(&got, &lease, &terminal); err != nil {
		t.Fatal(err)
	}
	if deref(got) != outcome || lease != nil || terminal == nil || *terminal != now {
		t.Fatalf("attempt = outcome %s, lease %v, terminal_at_ms %v; want %s, NULL, %d", deref(got), lease, terminal, outcome, now)
	}
}

// checkExecChanged checks that the execution row changed in exactly the
// columns of want, plus raw_fields gaining last_failure_message.
func checkExecChanged(t *testing.T, before, after, want map[string]any, failure string) {
	t.Helper()
	for col, v := range after {
		switch {
		case col == "raw_fields":
			raw := v.(map[string]any)
			if raw["last_failure_message"] != failure {
				t.Errorf("raw_fields.last_failure_message = %v; want %s", raw["last_failure_message"], failure)
			}
			delete(raw, "last_failure_message")
			if !jsonEqual(raw, before["raw_fields"]) {
				t.Errorf("raw_fields = %v; want %v plus last_failure_message", raw, before["raw_fields"])
			}
		case hasKey(want, col):
			if !jsonEqual(v, want[col]) {
				t.Errorf("%s = %v; want %v", col, v, want[col])
			}
		case !jsonEqual(v, before[col]):
			t.Errorf("%s changed from %v to %v; FlowFabric leaves it", col, before[col], v)
		}
	}
}

// hasKey reports whether m has key k (a nil value included).
func hasKey(m map[string]any, k string) bool {
	_, ok := m[k]
	return ok
}

func checkOneLeaseEvent(t *testing.T, db store.DB, p int16, id string, eventID, now int64) {
	t.Helper()
	evs := fftest.LeaseEvents(t, db, id)
	if len(evs) != 1 || evs[0].EventType != "expired" || int16(evs[0].Partition) != p || evs[0].OccurredAtMs != now ||
		evs[0].EventID != eventID || evs[0].Namespace == nil || *evs[0].Namespace != "tenant-a" ||
		evs[0].InstanceTag == nil || *evs[0].InstanceTag != "inst-1" {
		t.Fatalf("lease events = %+v; want one expired at now with namespace and tag", evs)
	}
}
