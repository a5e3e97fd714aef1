package ffseed_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/flowfabric/ffreconcile/internal/ffseed"
	"github.com/flowfabric/ffreconcile/internal/testdb"
)

const (
	execID  = "6f1c1a52-6c4e-4d8e-9d0c-0a1b2c3d4e5f"
	flowID  = "0d9b7e2e-2a57-4b8e-a0f3-5c6d7e8f9a0b"
	otherID = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"
)

// seedCase makes a row of one type in partition p: full sets every field,
// otherwise only the keys (the rest taking the defaults).
type seedCase struct {
	name string
	mk   func(p int16, full bool) ffseed.Row
}

var cases = []seedCase{
	{"Exec", func(p int16, full bool) ffseed.Row {
		if !full {
			return ffseed.Exec{Partition: p, ID: execID, Namespace: "ns", Tags: map[string]string{"k": "v"}}
		}
		return ffseed.Exec{Partition: p, ID: execID, FlowID: flowID, LaneID: "batch", LifecyclePhase: "runnable",
			OwnershipState: "unowned", EligibilityState: "eligible_now", PublicState: "waiting", AttemptState: "pending",
			AttemptIndex: 2, CreatedAtMs: 10, DeadlineAtMs: ffseed.Ms(20), StartedAtMs: ffseed.Ms(30),
			TerminalAtMs: ffseed.Ms(40), Policy: map[string]any{"retry_policy": map[string]any{"max_retries": 2}},
			RawFields: json.RawMessage(`{"namespace": "x", "last_mutation_at": "5"}`)}
	}},
	{"Attempt", func(p int16, full bool) ffseed.Row {
		if !full {
			return ffseed.Attempt{Partition: p, ExecutionID: execID}
		}
		return ffseed.Attempt{Partition: p, ExecutionID: execID, AttemptIndex: 1, WorkerID: "w", WorkerInstanceID: "wi",
			LeaseEpoch: 3, LeaseExpiresAtMs: ffseed.Ms(5), StartedAtMs: ffseed.Ms(6), TerminalAtMs: ffseed.Ms(7), Outcome: "success"}
	}},
	{"Suspension", func(p int16, full bool) ffseed.Row {
		if !full {
			return ffseed.Suspension{Partition: p, ExecutionID: execID, SuspensionID: otherID}
		}
		return ffseed.Suspension{Partition: p, ExecutionID: execID, SuspensionID: otherID, SuspendedAtMs: 4,
			TimeoutAtMs: ffseed.Ms(9), ReasonCode: "waiting_for_signal", Condition: json.RawMessage(`{"kind": "signal"}`),
			MemberMap: map[string]any{"a": []string{"b"}}, Behavior: ffseed.Str("cancel")}
	}},
	{"Waitpoint", func(p int16, full bool) ffseed.Row {
		if !full {
			return ffseed.Waitpoint{Partition: p, ID: otherID, ExecutionID: execID}
		}
		return ffseed.Waitpoint{Partition: p, ID: otherID, ExecutionID: execID, TokenKid: "k", Token: "t", CreatedAtMs: 3,
			ExpiresAtMs: ffseed.Ms(8), Key: "approval", State: "active", RequiredSignalNames: []string{"approval", `a "quoted", \ one`},
			ActivatedAtMs: ffseed.Ms(4)}
	}},
	{"Edge", func(p int16, full bool) ffseed.Row {
		e := ffseed.Edge{Partition: p, FlowID: flowID, EdgeID: otherID, UpstreamEID: execID, DownstreamEID: otherID}
		if full {
			e.Policy = ffseed.AnyOfCancelRemaining
		}
		return e
	}},
	{"EdgeGroup", func(p int16, full bool) ffseed.Row {
		if !full {
			return ffseed.EdgeGroup{Partition: p, FlowID: flowID, DownstreamEID: otherID}
		}
		return ffseed.EdgeGroup{Partition: p, FlowID: flowID, DownstreamEID: otherID, Policy: ffseed.AnyOfCancelRemaining,
			KTarget: 1, Success: 1, Fail: 2, Skip: 3, Running: 4, Flag: true, Members: []string{execID, "{fp:1}:x"}}
	}},
	{"PendingCancel", func(p int16, full bool) ffseed.Row {
		c := ffseed.PendingCancel{Partition: p, FlowID: flowID, DownstreamEID: otherID}
		if full {
			c.EnqueuedAtMs = 12
		}
		return c
	}},
	{"CompletionEvent", func(p int16, full bool) ffseed.Row {
		if !full {
			return ffseed.CompletionEvent{Partition: p, ExecutionID: execID}
		}
		return ffseed.CompletionEvent{Partition: p, ExecutionID: execID, FlowID: flowID, Outcome: "failed", Namespace: "ns",
			InstanceTag: "tag", OccurredAtMs: 3, CommittedAtMs: 4, DispatchedAtMs: ffseed.Ms(5)}
	}},
	{"LeaseEvent", func(p int16, full bool) ffseed.Row {
		if !full {
			return ffseed.LeaseEvent{Partition: int32(p), ExecutionID: execID}
		}
		return ffseed.LeaseEvent{Partition: int32(p), ExecutionID: execID, LeaseID: "l", EventType: "revoked",
			OccurredAtMs: 9, Namespace: "ns", InstanceTag: "tag"}
	}},
	{"Budget", func(p int16, full bool) ffseed.Row {
		if !full {
			return ffseed.Budget{Partition: p, ID: "b1"}
		}
		return ffseed.Budget{Partition: p, ID: "b1", Policy: map[string]any{"hard_limit": 1000}, CreatedAtMs: 2, UpdatedAtMs: 3,
			ScopeType: "flow", ScopeID: "s", EnforcementMode: "hard", BreachCount: 1, SoftBreachCount: 2,
			LastBreachAtMs: ffseed.Ms(4), LastBreachDim: "tokens", NextResetAtMs: ffseed.Ms(5)}
	}},
	{"BudgetUsage", func(p int16, full bool) ffseed.Row {
		if !full {
			return ffseed.BudgetUsage{Partition: p, BudgetID: "b1", Dimensions: "tokens"}
		}
		return ffseed.BudgetUsage{Partition: p, BudgetID: "b1", Dimensions: "tokens", CurrentValue: 7,
			LastResetAtMs: ffseed.Ms(2), UpdatedAtMs: 3}
	}},
	{"BudgetDedup", func(p int16, full bool) ffseed.Row {
		if !full {
			return ffseed.BudgetDedup{Partition: p, Key: "k", ExpiresAtMs: 5000}
		}
		return ffseed.BudgetDedup{Partition: p, Key: "k", Outcome: json.RawMessage(`{"outcome": "rejected"}`), AppliedAtMs: 2, ExpiresAtMs: 3}
	}},
	{"WorkerRegistration", func(p int16, full bool) ffseed.Row {
		if !full {
			return ffseed.WorkerRegistration{Partition: p, InstanceID: "i1"}
		}
		return ffseed.WorkerRegistration{Partition: p, Namespace: "ns", InstanceID: "i1", WorkerID: "w", Lanes: []string{"a", "b"},
			CapabilitiesCSV: "gpu", LastHeartbeatMs: 5, TTLMs: 6, RegisteredAtMs: 7}
	}},
	{"WorkerEvent", func(p int16, full bool) ffseed.Row {
		e := ffseed.WorkerEvent{Partition: p, Namespace: "ns", InstanceID: "i1", Kind: "expired", AtMs: 3}
		if full {
			e.Reason = "ttl"
		}
		return e
	}},
	{"FlowCore", func(p int16, full bool) ffseed.Row {
		if !full {
			return ffseed.FlowCore{Partition: p, FlowID: flowID}
		}
		return ffseed.FlowCore{Partition: p, FlowID: flowID, State: "cancelled", CreatedAtMs: 2, TerminalAtMs: ffseed.Ms(3),
			RawFields: map[string]any{"namespace": "ns"}}
	}},
	{"CancelBacklog", func(p int16, full bool) ffseed.Row {
		if !full {
			return ffseed.CancelBacklog{Partition: p, FlowID: flowID}
		}
		return ffseed.CancelBacklog{Partition: p, FlowID: flowID, RequestedAtMs: 2, Requester: "r", Reason: "why",
			GraceUntilMs: ffseed.Ms(3), Policy: "cancel_flow_only", Status: "acked"}
	}},
	{"CancelBacklogMember", func(p int16, full bool) ffseed.Row {
		id := execID
		if full {
			id = ffseed.WireID(p, execID)
		}
		return ffseed.CancelBacklogMember{Partition: p, FlowID: flowID, ExecutionID: id}
	}},
	{"ClaimGrant", func(p int16, full bool) ffseed.Row {
		if !full {
			return ffseed.ClaimGrant{Partition: p, ID: ffseed.MD5(execID), ExecutionID: execID, ExpiresAtMs: 5000}
		}
		return ffseed.ClaimGrant{Partition: p, ID: ffseed.MD5(execID), ExecutionID: execID, Kind: "reclaim", WorkerID: "w",
			WorkerInstanceID: "wi", GrantTTLMs: 5, IssuedAtMs: 6, ExpiresAtMs: 7}
	}},
	{"QuotaPolicy", func(p int16, full bool) ffseed.Row {
		if !full {
			return ffseed.QuotaPolicy{Partition: p, ID: "q"}
		}
		return ffseed.QuotaPolicy{Partition: p, ID: "q", WindowSeconds: 60, MaxRequests: 100, ConcurrencyCap: 2,
			ActiveConcurrency: 1, CreatedAtMs: 2, UpdatedAtMs: 3}
	}},
	{"QuotaAdmitted", func(p int16, full bool) ffseed.Row {
		if !full {
			return ffseed.QuotaAdmitted{Partition: p, PolicyID: "q", ExecutionID: execID, ExpiresAtMs: 5000}
		}
		return ffseed.QuotaAdmitted{Partition: p, PolicyID: "q", ExecutionID: execID, AdmittedAtMs: 2, ExpiresAtMs: 3}
	}},
	{"QuotaWindow", func(p int16, full bool) ffseed.Row {
		w := ffseed.QuotaWindow{Partition: p, PolicyID: "q", ExecutionID: execID}
		if full {
			w.Dimension, w.AdmittedAtMs = "d", 4
		}
		return w
	}},
	{"OperatorEvent", func(p int16, full bool) ffseed.Row {
		e := ffseed.OperatorEvent{Partition: int32(p), ExecutionID: execID, EventType: "replayed"}
		if full {
			e.OccurredAtMs, e.Namespace, e.InstanceTag = 3, "ns", "tag"
		}
		return e
	}},
	{"SignalEvent", func(p int16, full bool) ffseed.Row {
		e := ffseed.SignalEvent{Partition: int32(p), ExecutionID: execID, SignalID: "s"}
		if full {
			e.WaitpointID, e.SourceIdentity, e.DeliveredAtMs, e.Namespace, e.InstanceTag = "wp", "src", 3, "ns", "tag"
		}
		return e
	}},
	{"StreamFrame", func(p int16, full bool) ffseed.Row {
		f := ffseed.StreamFrame{Partition: p, ExecutionID: execID}
		if full {
			f.AttemptIndex, f.TsMs, f.Seq, f.Fields, f.Mode, f.CreatedAtMs = 1, 2, 3, map[string]any{"a": 1}, "replace", 4
		}
		return f
	}},
	{"StreamMeta", func(p int16, full bool) ffseed.Row {
		m := ffseed.StreamMeta{Partition: p, ExecutionID: execID}
		if full {
			m.AttemptIndex = 2
		}
		return m
	}},
	{"StreamSummary", func(p int16, full bool) ffseed.Row {
		s := ffseed.StreamSummary{Partition: p, ExecutionID: execID}
		if full {
			s.AttemptIndex, s.Document, s.LastUpdatedMs, s.FirstAppliedMs = 1, json.RawMessage(`{"x": [1, 2]}`), 2, 3
		}
		return s
	}},
}

// TestWaysWriteTheSameRow writes each row type every way (Insert on the
// pool, Queue on a batch sent in a pgx.Tx, InsertMany on a *pgx.Conn, its
// columns sent as arrays or, when alike in every row, as scalars) and checks
// that every way wrote the same row, compared as to_jsonb of the rows.
func TestWaysWriteTheSameRow(t *testing.T) {
	db := testdb.New(t)
	ctx := context.Background()
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			table := c.mk(0, true).Table()
			// Partitions 1-6 hold the full row, 7-9 the sparse one.
			if err := ffseed.Insert(ctx, db.Pool, c.mk(1, true)); err != nil {
				t.Fatal(err)
			}
			if err := ffseed.Insert(ctx, db.Pool, c.mk(7, false)); err != nil {
				t.Fatal(err)
			}
			tx, err := db.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			b := &pgx.Batch{}
			if err := ffseed.QueueAll(b, c.mk(2, true), c.mk(8, false)); err != nil {
				t.Fatal(err)
			}
			if err := tx.SendBatch(ctx, b).Close(); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			// Every column an array (the rows differ), then every one but
			// the partition a scalar (alike).
			if err := ffseed.InsertMany(ctx, conn.Conn(), []ffseed.Row{c.mk(3, true), c.mk(9, false)}); err != nil {
				t.Fatal(err)
			}
			if err := ffseed.InsertMany(ctx, conn.Conn(), []ffseed.Row{c.mk(4, true), c.mk(5, true), c.mk(6, true)}); err != nil {
				t.Fatal(err)
			}
			rows := readRows(t, db.Pool, table)
			if len(rows) != 9 {
				t.Fatalf("%s: %d rows, want 9: %v", table, len(rows), rows)
			}
			for p, r := range rows {
				want := rows[1]
				if p >= 7 {
					want = rows[7]
				}
				if !reflect.DeepEqual(r, want) {
					t.Errorf("%s partition %d:\n got %v\nwant %v", table, p, r, want)
				}
			}
			if reflect.DeepEqual(rows[1], rows[7]) {
				t.Errorf("%s: the full and the sparse row are alike: %v", table, rows[1])
			}
		})
	}
}

// readRows reads every row of table as to_jsonb, by partition, without
// partition_key, the identity event_id and the clock-defaulted
// committed_at_ms of a sparse completion event.
func readRows(t *testing.T, db ffseed.DB, table string) map[int]map[string]any {
	t.Helper()
	pool := db.(interface {
		Query(context.Context, string, ...any) (pgx.Rows, error)
	})
	rows, err := pool.Query(context.Background(), `SELECT to_jsonb(r)::text FROM `+table+` r`)
	if err != nil {
		t.Fatal(err)
	}
	texts, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]map[string]any{}
	for _, s := range texts {
		var m map[string]any
		if err := json.Unmarshal([]byte(s), &m); err != nil {
			t.Fatal(err)
		}
		p := int(m["partition_key"].(float64))
		delete(m, "partition_key")
		delete(m, "event_id")
		if p >= 7 && table == "ff_completion_event" {
			if m["committed_at_ms"].(float64) < 1e12 {
				t.Errorf("committed_at_ms %v is not the clock's", m["committed_at_ms"])
			}
			delete(m, "committed_at_ms")
		}
		if m["execution_id"] == ffseed.WireID(int16(p), execID) {
			m["execution_id"] = "wire"
		}
		out[p] = m
	}
	return out
}

// TestDefaults checks the defaults the rows' comments promise, as stored.
func TestDefaults(t *testing.T) {
	db := testdb.New(t)
	ctx := context.Background()
	e := ffseed.Exec{Partition: 3}.Defaults()
	if err := ffseed.Insert(ctx, db.Pool, e); err != nil {
		t.Fatal(err)
	}
	var got string
	if err := db.Pool.QueryRow(ctx, `SELECT concat_ws(',', lane_id, lifecycle_phase, ownership_state, eligibility_state,
		public_state, attempt_state, attempt_index, created_at_ms, policy IS NULL, raw_fields::text, flow_id IS NULL)
		FROM ff_exec_core WHERE partition_key = 3 AND execution_id = $1`, e.ID).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if want := "default,active,leased,not_applicable,running,running_attempt,0,1,t,{},t"; got != want {
		t.Errorf("exec defaults: %s, want %s", got, want)
	}
	id, err := ffseed.InsertCompletion(ctx, db.Pool, ffseed.CompletionEvent{Partition: 3, ExecutionID: e.ID})
	if err != nil || id == 0 {
		t.Fatalf("InsertCompletion: %d, %v", id, err)
	}
	var md5 string
	if err := db.Pool.QueryRow(ctx, `SELECT md5('ret1')::uuid::text`).Scan(&md5); err != nil || md5 != ffseed.MD5UUID("ret1") {
		t.Errorf("MD5UUID(ret1) = %s, Postgres says %s (%v)", ffseed.MD5UUID("ret1"), md5, err)
	}
	n := 0
	if err := ffseed.InsertSeries(ctx, db.Pool, ffseed.SeriesChunk+3, func(i int) ffseed.FlowCore {
		n++
		return ffseed.FlowCore{Partition: int16(i % 256), FlowID: ffseed.MD5UUID("flow" + fmt.Sprint(i))}
	}); err != nil {
		t.Fatal(err)
	}
	var rows int
	if err := db.Pool.QueryRow(ctx, `SELECT count(DISTINCT flow_id) FROM ff_flow_core`).Scan(&rows); err != nil || rows != ffseed.SeriesChunk+3 || n != rows {
		t.Errorf("InsertSeries wrote %d rows of %d made (%v), want %d", rows, n, err, ffseed.SeriesChunk+3)
	}
	g := ffseed.ClaimGrant{Partition: 3, ExecutionID: e.ID, ExpiresAtMs: 5000}.Defaults()
	if len(g.ID) != 32 || g.IssuedAtMs != 4000 || g.WorkerInstanceID != "w1-i1" {
		t.Errorf("grant defaults: %+v", g)
	}
}

// TestErrorsNameTheTable checks that each way's error names the table, and
// that a bad value is an error, not a panic.
func TestErrorsNameTheTable(t *testing.T) {
	db := testdb.New(t)
	ctx := context.Background()
	dup := ffseed.FlowCore{Partition: 1, FlowID: flowID}
	if err := ffseed.Insert(ctx, db.Pool, dup); err != nil {
		t.Fatal(err)
	}
	check := func(way string, err error, table string) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), table) {
			t.Errorf("%s: error %v does not name %s", way, err, table)
		}
	}
	check("Insert", ffseed.Insert(ctx, db.Pool, dup), "ff_flow_core")
	check("InsertMany", ffseed.InsertMany(ctx, db.Pool, []ffseed.FlowCore{dup}), "ff_flow_core")
	b := &pgx.Batch{}
	if err := ffseed.Queue(b, dup); err != nil {
		t.Fatal(err)
	}
	check("Queue", db.Pool.SendBatch(ctx, b).Close(), "ff_flow_core")
	bad := ffseed.Exec{Policy: func() {}}
	check("Insert of an unmarshallable policy", ffseed.Insert(ctx, db.Pool, bad), "ff_exec_core")
	check("InsertMany of an unmarshallable policy", ffseed.InsertMany(ctx, db.Pool, []ffseed.Exec{bad}), "ff_exec_core")
	var pgErr interface{ SQLState() string }
	if err := ffseed.Insert(ctx, db.Pool, dup); !errors.As(err, &pgErr) || pgErr.SQLState() != "23505" {
		t.Errorf("the database's error is not wrapped: %v", err)
	}
}
