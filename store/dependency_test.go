package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
)

// TestDecodePolicyAndDecide pins FlowFabric's policy decoding (defaults
// included) and decision table (dispatch.rs decode_policy, evaluate and its
// unit tests). A regression is a downstream made eligible, skipped or left
// waiting where FlowFabric's dispatcher decides otherwise.
func TestDecodePolicyAndDecide(t *testing.T) {
	t.Parallel()
	decode := []struct {
		raw  string
		want store.EdgePolicy
		odd  bool
	}{
		{`{"kind":"all_of"}`, store.EdgePolicy{Kind: store.AllOf}, false},
		{`{"kind":"any_of","on_satisfied":"let_run"}`, store.EdgePolicy{Kind: store.AnyOf, LetRun: true}, false},
		{`{"kind":"any_of"}`, store.EdgePolicy{Kind: store.AnyOf}, false},
		{`{"kind":"any_of","on_satisfied":7}`, store.EdgePolicy{Kind: store.AnyOf}, false},
		{`{"kind":"quorum","k":2,"on_satisfied":"cancel_remaining"}`, store.EdgePolicy{Kind: store.Quorum, K: 2}, false},
		{`{"kind":"quorum"}`, store.EdgePolicy{Kind: store.Quorum, K: 1}, false},
		{`{"kind":"quorum","k":-2}`, store.EdgePolicy{Kind: store.Quorum, K: 1}, false},
		{`{"kind":"quorum","k":2.0}`, store.EdgePolicy{Kind: store.Quorum, K: 1}, false},
		{`{"kind":"quorum","k":"2"}`, store.EdgePolicy{Kind: store.Quorum, K: 1}, false},
		{`{"kind":"quorum","k":4294967296}`, store.EdgePolicy{Kind: store.Quorum, K: 1}, false},
		{`{"kind":"quorum","k":4294967295}`, store.EdgePolicy{Kind: store.Quorum, K: -1}, false},
		{`{"kind":"quorum","k":2147483648}`, store.EdgePolicy{Kind: store.Quorum, K: -2147483648}, false},
		{`{}`, store.EdgePolicy{Kind: store.AllOf}, true},
		{`{"kind":"most_of"}`, store.EdgePolicy{Kind: store.AllOf}, true},
		{`{"kind":3}`, store.EdgePolicy{Kind: store.AllOf}, true},
		{`[1,2]`, store.EdgePolicy{Kind: store.AllOf}, true},
		{`"any_of"`, store.EdgePolicy{Kind: store.AllOf}, true},
		{`null`, store.EdgePolicy{Kind: store.AllOf}, true},
	}
	for _, c := range decode {
		got, odd := store.DecodePolicy([]byte(c.raw))
		if got != c.want || odd != c.odd {
			t.Errorf("DecodePolicy(%s) = %+v, odd %v; want %+v, odd %v", c.raw, got, odd, c.want, c.odd)
		}
	}

	allOf, anyOf, letRun := store.EdgePolicy{Kind: store.AllOf}, store.EdgePolicy{Kind: store.AnyOf}, store.EdgePolicy{Kind: store.AnyOf, LetRun: true}
	quorum := func(k int32) store.EdgePolicy { return store.EdgePolicy{Kind: store.Quorum, K: k} }
	decide := []struct {
		p              store.EdgePolicy
		s, f, k, total int32
		want           store.Decision
		cancel         bool
	}{
		{allOf, 3, 0, 0, 3, store.Satisfied, false},
		{allOf, 2, 1, 0, 3, store.Impossible, false},
		{allOf, 1, 0, 0, 3, store.Pending, false},
		{allOf, 0, 0, 0, 0, store.Pending, false},
		{anyOf, 1, 0, 0, 3, store.Satisfied, true},
		{letRun, 1, 0, 0, 3, store.Satisfied, false},
		{anyOf, 0, 3, 0, 3, store.Impossible, false},
		{anyOf, 0, 2, 0, 3, store.Pending, false},
		{quorum(2), 2, 0, 1, 3, store.Satisfied, true},
		{quorum(3), 0, 3, 0, 5, store.Impossible, false},
		{quorum(3), 1, 2, 0, 5, store.Pending, false},
		{quorum(0), 0, 1, 0, 3, store.Satisfied, true},
		{quorum(-1), 0, 1, 0, 3, store.Satisfied, true},
	}
	for _, c := range decide {
		got, cancel := store.Decide(c.p, c.s, c.f, c.k, c.total)
		if got != c.want || cancel != c.cancel {
			t.Errorf("Decide(%+v, s=%d f=%d k=%d total=%d) = %s, cancel %v; want %s, cancel %v",
				c.p, c.s, c.f, c.k, c.total, got, cancel, c.want, c.cancel)
		}
	}
}

// flowFixture is a flow of partition p: upstreams running, one downstream
// blocked on them under policy.
type flowFixture struct {
	p    int16
	flow string
	down string
	ups  []string
}

func newFlow(t *testing.T, db store.DB, p int16, policy string, n int, namespace string) flowFixture {
	t.Helper()
	f := flowFixture{p: p, flow: fftest.NewUUID()}
	blocked := fftest.Blocked(p, f.flow)
	blocked.Namespace = namespace
	blocked.Tags = map[string]string{"cairn.instance_id": "i-" + namespace}
	f.down = fftest.InsertExec(t, db, blocked)
	for range n {
		f.ups = append(f.ups, fftest.InsertExec(t, db, fftest.Exec{Partition: p, FlowID: f.flow, Namespace: namespace}))
	}
	fftest.Link(t, db, p, f.flow, policy, f.down, f.ups...)
	return f
}

// emit writes upstream i's completion event, committed long ago.
func (f flowFixture) emit(t *testing.T, db store.DB, i int, outcome string) int64 {
	t.Helper()
	return fftest.InsertCompletion(t, db, fftest.Completion{Partition: f.p, ExecutionID: f.ups[i], FlowID: f.flow, Outcome: outcome})
}

func dispatch(t *testing.T, db store.Beginner, p int16, id int64) store.CompletionResult {
	t.Helper()
	res, err := store.DispatchCompletion(context.Background(), db, p, id, store.NowMs(), store.Filter{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// TestDispatchCascade runs FlowFabric's own cascade scenarios
// (pg_dispatch_dependency.rs) and the bad rows it tolerates through
// DispatchCompletion, checking every value the hop writes, and again through
// DispatchCompletionsOnLeaves on a connection set as a fleet's dispatch
// lanes are (generic plans of the leaves' statements). A regression is a
// counter, state, sibling list or skip event that differs from what
// FlowFabric's dispatcher writes for the same event, on either path.
func TestDispatchCascade(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	lane := openLane(t, db)
	leaves, err := store.LoadLeaves(ctx, db.Pool, store.DispatchTables...)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("LeavesAreWherePostgresPutsRows", func(t *testing.T) { testLeavesAreWherePostgresPutsRows(t, db.Pool, leaves) })
	t.Run("Parents", func(t *testing.T) { testDispatchCascade(t, db.Pool, dispatch) })
	t.Run("Leaves", func(t *testing.T) {
		// Half the scenarios' partitions warmed first, as a benchmark's
		// lanes are: their dispatches then run on the cached plans.
		if err := store.WarmDispatchOnLeaves(ctx, lane, leaves, []int16{3, 5, 7, 9, 11}, store.Filter{}); err != nil {
			t.Fatal(err)
		}
		testDispatchCascade(t, db.Pool, func(t *testing.T, _ store.Beginner, p int16, id int64) store.CompletionResult {
			t.Helper()
			res, err := store.DispatchCompletionsOnLeaves(ctx, lane, leaves, p, []int64{id}, store.NowMs(), store.Filter{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			return res[0]
		})
		// Every statement the lane ran names leaves and was planned
		// generically: no custom plan over a parent, and none at all.
		var statements, custom, generic int64
		var parents []string
		if err := lane.QueryRow(ctx, `
			SELECT count(*), sum(custom_plans), sum(generic_plans),
			       coalesce(array_agg(statement) FILTER (WHERE statement ~ '(FROM|UPDATE|JOIN) ff_[a-z_]+ '), '{}')
			  FROM pg_prepared_statements WHERE statement ~ 'ff_' AND statement !~ 'pg_prepared_statements'`).Scan(&statements, &custom, &generic, &parents); err != nil {
			t.Fatal(err)
		}
		t.Logf("lane: %d statements, %d generic plans", statements, generic)
		if statements == 0 || custom != 0 || generic < statements || len(parents) > 0 {
			t.Errorf("lane's prepared statements: %d, custom plans %d, generic plans %d, naming a parent: %q", statements, custom, generic, parents)
		}
	})
}

// openLane opens a pool of one connection to db with the session settings
// of a fleet's dispatch lane (internal/fleet).
func openLane(t *testing.T, db *testdb.DB) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	cfg.ConnConfig.RuntimeParams["enable_seqscan"] = "off"
	lane, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lane.Close)
	return lane
}

// testLeavesAreWherePostgresPutsRows: for every partition key and every
// table a dispatch names, the leaf LoadLeaves gave (lv) is the one Postgres
// routes a row of that key to (tableoid of rows inserted for keys 0-255,
// rolled back). A regression dispatches against the wrong leaf: its claim
// finds no event, its hops no group, and the event is read as already
// dispatched.
func testLeavesAreWherePostgresPutsRows(t *testing.T, pool *pgxpool.Pool, lv *store.Leaves) {
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	inserts := map[string]string{
		"ff_completion_event": `INSERT INTO ff_completion_event (partition_key, execution_id, outcome, occurred_at_ms)
			SELECT k, gen_random_uuid(), 'success', 1 FROM generate_series(0, 255) k RETURNING partition_key, tableoid::regclass::text`,
		"ff_edge": `INSERT INTO ff_edge (partition_key, flow_id, edge_id, upstream_eid, downstream_eid, policy)
			SELECT k, gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), '{}' FROM generate_series(0, 255) k
			RETURNING partition_key, tableoid::regclass::text`,
		"ff_edge_group": `INSERT INTO ff_edge_group (partition_key, flow_id, downstream_eid, policy)
			SELECT k, gen_random_uuid(), gen_random_uuid(), '{}' FROM generate_series(0, 255) k RETURNING partition_key, tableoid::regclass::text`,
		"ff_exec_core": `INSERT INTO ff_exec_core (partition_key, execution_id, lane_id, lifecycle_phase, ownership_state, eligibility_state,
			       public_state, attempt_state, created_at_ms)
			SELECT k, gen_random_uuid(), 'l', 'runnable', 'unowned', 'eligible_now', 'waiting', 'pending', 1 FROM generate_series(0, 255) k
			RETURNING partition_key, tableoid::regclass::text`,
		"ff_pending_cancel_groups": `INSERT INTO ff_pending_cancel_groups (partition_key, flow_id, downstream_eid, enqueued_at_ms)
			SELECT k, gen_random_uuid(), gen_random_uuid(), 1 FROM generate_series(0, 255) k RETURNING partition_key, tableoid::regclass::text`,
	}
	for _, table := range store.DispatchTables {
		rows, err := tx.Query(ctx, inserts[table])
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for rows.Next() {
			var (
				k    int16
				leaf string
			)
			if err := rows.Scan(&k, &leaf); err != nil {
				t.Fatal(err)
			}
			if got := lv.Of(table, k); got != leaf {
				t.Errorf("%s, partition key %d: LoadLeaves says %s, Postgres put the row in %s", table, k, got, leaf)
			}
			n++
		}
		if err := rows.Err(); err != nil || n != 256 {
			t.Fatalf("%s: %d rows, %v", table, n, err)
		}
	}
}

func testDispatchCascade(t *testing.T, pool *pgxpool.Pool, dispatch func(*testing.T, store.Beginner, int16, int64) store.CompletionResult) {
	ctx := context.Background()
	t.Run("AllOfHappyPath", func(t *testing.T) {
		f := newFlow(t, pool, 3, `{"kind":"all_of"}`, 3, "acme")
		for i := range 3 {
			res := dispatch(t, pool, f.p, f.emit(t, pool, i, "success"))
			want := store.Pending
			if i == 2 {
				want = store.Satisfied
			}
			if res.Outcome != store.CompletionDispatched || len(res.Hops) != 1 || res.Hops[0].Decision != want {
				t.Fatalf("event %d: %+v, want one %s hop", i, res, want)
			}
			if ex := fftest.ReadExec(t, pool, f.p, f.down); (ex.EligibilityState == "eligible_now") != (i == 2) {
				t.Fatalf("after event %d the downstream is %+v", i, ex)
			}
		}
		ex := fftest.ReadExec(t, pool, f.p, f.down)
		if ex.LifecyclePhase != "runnable" || ex.PublicState != "waiting" || ex.AttemptState != "pending" {
			t.Fatalf("satisfied downstream: %+v, want runnable with its other states kept", ex)
		}
		if g := fftest.ReadGroup(t, pool, f.p, f.flow, f.down); g.Success != 3 || g.Running != 0 || g.Flag {
			t.Fatalf("group %+v", g)
		}
		if fftest.PendingCancelExists(t, pool, f.p, f.flow, f.down) {
			t.Fatal("all_of queued a sibling cancel")
		}
	})

	t.Run("AnyOfCancelRemaining", func(t *testing.T) {
		f := newFlow(t, pool, 4, `{"kind":"any_of","on_satisfied":"cancel_remaining"}`, 4, "")
		// A terminal sibling and a skipped one are not members.
		if _, err := pool.Exec(ctx, `UPDATE ff_exec_core SET lifecycle_phase = 'terminal' WHERE execution_id = $1`, f.ups[2]); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `UPDATE ff_exec_core SET public_state = 'skipped' WHERE execution_id = $1`, f.ups[3]); err != nil {
			t.Fatal(err)
		}
		res := dispatch(t, pool, f.p, f.emit(t, pool, 0, "success"))
		if h := res.Hops[0]; h.Decision != store.Satisfied || !h.Flagged || !h.Changed {
			t.Fatalf("hop %+v", h)
		}
		g := fftest.ReadGroup(t, pool, f.p, f.flow, f.down)
		if !g.Flag || !slices.Equal(g.Members, []string{f.ups[1]}) || g.Success != 1 || g.Running != 3 {
			t.Fatalf("group %+v, want flagged with members [%s]", g, f.ups[1])
		}
		if !fftest.PendingCancelExists(t, pool, f.p, f.flow, f.down) {
			t.Fatal("no pending cancel group")
		}
		// A later success re-satisfies without re-flagging or recomputing.
		if _, err := pool.Exec(ctx, `UPDATE ff_edge_group SET cancel_siblings_pending_members = '{kept}' WHERE downstream_eid = $1`, f.down); err != nil {
			t.Fatal(err)
		}
		res = dispatch(t, pool, f.p, f.emit(t, pool, 1, "success"))
		if h := res.Hops[0]; h.Decision != store.Satisfied || h.Flagged {
			t.Fatalf("second hop %+v", h)
		}
		if g := fftest.ReadGroup(t, pool, f.p, f.flow, f.down); !slices.Equal(g.Members, []string{"kept"}) || g.Success != 2 {
			t.Fatalf("group after a second success: %+v", g)
		}
	})

	t.Run("QuorumLetRun", func(t *testing.T) {
		f := newFlow(t, pool, 5, `{"kind":"quorum","k":2,"on_satisfied":"let_run"}`, 3, "")
		dispatch(t, pool, f.p, f.emit(t, pool, 0, "success"))
		if ex := fftest.ReadExec(t, pool, f.p, f.down); ex.EligibilityState != "blocked_by_dependencies" {
			t.Fatalf("1 of 2: %+v", ex)
		}
		dispatch(t, pool, f.p, f.emit(t, pool, 1, "success"))
		if ex := fftest.ReadExec(t, pool, f.p, f.down); ex.EligibilityState != "eligible_now" {
			t.Fatalf("2 of 2: %+v", ex)
		}
		if g := fftest.ReadGroup(t, pool, f.p, f.flow, f.down); g.Flag || fftest.PendingCancelExists(t, pool, f.p, f.flow, f.down) {
			t.Fatalf("let_run queued a cancel: %+v", g)
		}
	})

	t.Run("QuorumImpossibleSkipsWithTenant", func(t *testing.T) {
		f := newFlow(t, pool, 6, `{"kind":"quorum","k":3,"on_satisfied":"cancel_remaining"}`, 5, "acme")
		var last store.CompletionResult
		for i := range 3 {
			last = dispatch(t, pool, f.p, f.emit(t, pool, i, []string{"failed", "cancelled", "expired"}[i]))
		}
		h := last.Hops[0]
		if h.Decision != store.Impossible || !h.Changed || h.SkipEventID == 0 {
			t.Fatalf("third hop %+v", h)
		}
		ex := fftest.ReadExec(t, pool, f.p, f.down)
		if ex.LifecyclePhase != "terminal" || ex.PublicState != "skipped" || ex.EligibilityState != "not_applicable" ||
			ex.AttemptState != "attempt_terminal" || ex.TerminalAtMs == nil {
			t.Fatalf("impossible downstream: %+v", ex)
		}
		evs := fftest.CompletionEvents(t, pool, f.down)
		if len(evs) != 1 || evs[0].Outcome != "skipped" || evs[0].EventID != h.SkipEventID || *evs[0].FlowID != f.flow ||
			evs[0].Namespace == nil || *evs[0].Namespace != "acme" || evs[0].InstanceTag == nil || *evs[0].InstanceTag != "i-acme" {
			t.Fatalf("skip events %+v, want one carrying namespace acme and tag i-acme", evs)
		}
		// A fourth failure finds the downstream terminal: no second event.
		res := dispatch(t, pool, f.p, f.emit(t, pool, 3, "failed"))
		if h := res.Hops[0]; h.Decision != store.Impossible || h.Changed || h.SkipEventID != 0 {
			t.Fatalf("fourth hop %+v", h)
		}
		if g := fftest.ReadGroup(t, pool, f.p, f.flow, f.down); g.Fail != 4 || g.Running != 1 {
			t.Fatalf("group %+v", g)
		}
	})

	t.Run("ReplayIsANoOp", func(t *testing.T) {
		f := newFlow(t, pool, 7, `{"kind":"all_of"}`, 1, "")
		id := f.emit(t, pool, 0, "success")
		if res := dispatch(t, pool, f.p, id); res.Outcome != store.CompletionDispatched || len(res.Hops) != 1 {
			t.Fatalf("first %+v", res)
		}
		if res := dispatch(t, pool, f.p, id); res.Outcome != store.CompletionAlreadyDispatched || len(res.Hops) != 0 {
			t.Fatalf("replay %+v", res)
		}
		if g := fftest.ReadGroup(t, pool, f.p, f.flow, f.down); g.Success != 1 {
			t.Fatalf("group after a replay %+v", g)
		}
		if res := dispatch(t, pool, f.p, 1<<50); res.Outcome != store.CompletionAlreadyDispatched {
			t.Fatalf("missing event: %+v", res)
		}
	})

	t.Run("StandaloneIsClaimed", func(t *testing.T) {
		id := fftest.InsertCompletion(t, pool, fftest.Completion{Partition: 8, ExecutionID: fftest.NewUUID(), Outcome: "success"})
		if res := dispatch(t, pool, 8, id); res.Outcome != store.CompletionDispatched || len(res.Hops) != 0 {
			t.Fatalf("%+v", res)
		}
		if !fftest.Dispatched(t, pool, 8, id) {
			t.Fatal("standalone event not claimed")
		}
	})

	t.Run("BadRows", func(t *testing.T) {
		// An edge without a group row, a group whose policy is not an
		// object and whose downstream is missing, and an outcome
		// FlowFabric never writes (a failure).
		p, flow, up := int16(9), fftest.NewUUID(), fftest.NewUUID()
		fftest.InsertExec(t, pool, fftest.Exec{Partition: p, ID: up, FlowID: flow})
		noGroup := fftest.InsertExec(t, pool, fftest.Blocked(p, flow))
		fftest.InsertEdge(t, pool, p, flow, up, noGroup, `{"kind":"all_of"}`)
		gone := fftest.NewUUID()
		fftest.InsertEdge(t, pool, p, flow, up, gone, `[]`)
		fftest.InsertGroup(t, pool, fftest.Group{Partition: p, FlowID: flow, DownstreamEID: gone, Policy: `[]`, Running: 1})
		id := fftest.InsertCompletion(t, pool, fftest.Completion{Partition: p, ExecutionID: up, FlowID: flow, Outcome: "exploded"})
		res := dispatch(t, pool, p, id)
		if !res.UnknownOutcome || len(res.Hops) != 2 {
			t.Fatalf("%+v", res)
		}
		for _, h := range res.Hops {
			switch h.DownstreamEID {
			case noGroup:
				if !h.GroupMissing {
					t.Errorf("edge without group: %+v", h)
				}
			case gone:
				if !h.OddPolicy || !h.DownstreamMissing || h.Decision != store.Impossible || h.Changed {
					t.Errorf("odd group of a missing downstream: %+v", h)
				}
			}
		}
		if g := fftest.ReadGroup(t, pool, p, flow, gone); g.Fail != 1 || g.Running != 0 {
			t.Fatalf("odd group's counters %+v", g)
		}
	})

	t.Run("ActiveDownstreamReSatisfied", func(t *testing.T) {
		// FlowFabric rewrites eligibility of a downstream already running
		// when a satisfied any_of sees another success; the phase stays.
		f := newFlow(t, pool, 10, `{"kind":"any_of","on_satisfied":"let_run"}`, 2, "")
		if _, err := pool.Exec(ctx, `UPDATE ff_exec_core SET lifecycle_phase = 'active', eligibility_state = 'not_applicable'
			WHERE execution_id = $1`, f.down); err != nil {
			t.Fatal(err)
		}
		dispatch(t, pool, f.p, f.emit(t, pool, 0, "success"))
		if ex := fftest.ReadExec(t, pool, f.p, f.down); ex.LifecyclePhase != "active" || ex.EligibilityState != "eligible_now" {
			t.Fatalf("%+v", ex)
		}
	})

	t.Run("DuplicateEdgesCountTwice", func(t *testing.T) {
		f := newFlow(t, pool, 11, `{"kind":"all_of"}`, 1, "")
		fftest.InsertEdge(t, pool, f.p, f.flow, f.ups[0], f.down, `{"kind":"all_of"}`)
		res := dispatch(t, pool, f.p, f.emit(t, pool, 0, "success"))
		if len(res.Hops) != 2 {
			t.Fatalf("%+v", res)
		}
		if g := fftest.ReadGroup(t, pool, f.p, f.flow, f.down); g.Success != 2 || g.Running != 0 {
			t.Fatalf("group %+v", g)
		}
	})
}

// TestDispatchTenantFilter: the filter reads the event's own namespace and
// instance_tag columns, the tag by value, as FlowFabric's reconciler does; an
// event outside it, or with NULL columns, is left undispatched. A regression
// dispatches another tenant's events.
func TestDispatchTenantFilter(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t).Pool
	ns, tag := "acme", "i-1"
	ev := func(namespace, instanceTag *string) int64 {
		return fftest.InsertCompletion(t, pool, fftest.Completion{Partition: 1, ExecutionID: fftest.NewUUID(), Outcome: "success",
			Namespace: namespace, InstanceTag: instanceTag})
	}
	acme, beta, null := ev(&ns, &tag), ev(fftest.Str("beta"), &tag), ev(nil, nil)
	for _, c := range []struct {
		f    store.Filter
		id   int64
		want store.CompletionOutcome
	}{
		{store.Filter{Namespace: "beta"}, acme, store.CompletionOutsideTenant},
		{store.Filter{Namespace: "acme"}, null, store.CompletionOutsideTenant},
		{store.Filter{TagKey: "cairn.instance_id", TagValue: "i-2"}, acme, store.CompletionOutsideTenant},
		{store.Filter{Namespace: "acme", TagKey: "cairn.instance_id", TagValue: "i-1"}, acme, store.CompletionDispatched},
		{store.Filter{TagKey: "any-key", TagValue: "i-1"}, beta, store.CompletionDispatched},
	} {
		res, err := store.DispatchCompletion(context.Background(), pool, 1, c.id, store.NowMs(), c.f, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.Outcome != c.want {
			t.Errorf("event %d under %s: %s, want %s", c.id, c.f, res.Outcome, c.want)
		}
	}
	if fftest.Dispatched(t, pool, 1, null) {
		t.Fatal("an event without a tenant was dispatched under a filter")
	}
}

// TestDispatchHotGroupIsExact dispatches 240 events into one fan-in group
// from 8 connections at once: every event is claimed and the counters come
// out exact. FlowFabric's SERIALIZABLE hops fail each other here (40001)
// and, after three tries, lose the hop with the claim committed; the
// fleet's hops queue on the group's lock. A regression is a counter short of
// 240 or an event left claimed without its hop.
func TestDispatchHotGroupIsExact(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t).Pool
	const n = 240
	f := newFlow(t, pool, 12, fmt.Sprintf(`{"kind":"quorum","k":%d,"on_satisfied":"let_run"}`, n), n, "")
	ids := make([]int64, n)
	for i := range n {
		ids[i] = f.emit(t, pool, i, "success")
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	next := make(chan int64, n)
	for _, id := range ids {
		next <- id
	}
	close(next)
	for range 8 {
		wg.Go(func() {
			for id := range next {
				res, err := store.DispatchCompletion(context.Background(), pool, f.p, id, store.NowMs(), store.Filter{}, nil)
				if err == nil && res.Outcome != store.CompletionDispatched {
					err = fmt.Errorf("event %d: %s", id, res.Outcome)
				}
				if err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	g := fftest.ReadGroup(t, pool, f.p, f.flow, f.down)
	if g.Success != n || g.Running != 0 {
		t.Fatalf("group after %d concurrent dispatches: %+v", n, g)
	}
	if left := fftest.Count(t, pool, `SELECT count(*) FROM ff_completion_event WHERE flow_id = $1 AND dispatched_at_ms IS NULL`, f.flow); left != 0 {
		t.Fatalf("%d events undispatched", left)
	}
	if ex := fftest.ReadExec(t, pool, f.p, f.down); ex.EligibilityState != "eligible_now" {
		t.Fatalf("downstream %+v", ex)
	}
}

// TestDispatchKilledMidCascadeLosesNoHop: an event with three edges is
// dispatched on a connection that is terminated (pg_terminate_backend, as
// when its process dies) after two hops, while it waits for the third
// group's lock. Nothing of it remains: the event is unclaimed and the first
// two groups unchanged, so dispatching it again advances each edge exactly
// once. FlowFabric has committed the claim and two hops by then and loses
// the third for good. A regression is a claimed event with a group short of
// its count, or a group counted twice.
func TestDispatchKilledMidCascadeLosesNoHop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	pool := db.Pool
	p, flow, up := int16(13), fftest.NewUUID(), fftest.NewUUID()
	fftest.InsertExec(t, pool, fftest.Exec{Partition: p, ID: up, FlowID: flow})
	downs := []string{fftest.NewUUID(), fftest.NewUUID(), fftest.NewUUID()}
	slices.Sort(downs) // hops go in downstream order; the last one blocks
	for _, d := range downs {
		fftest.InsertExec(t, pool, fftest.Exec{Partition: p, ID: d, FlowID: flow, LifecyclePhase: "blocked",
			OwnershipState: "unowned", EligibilityState: "blocked_by_dependencies", PublicState: "waiting", AttemptState: "pending"})
		fftest.Link(t, pool, p, flow, `{"kind":"all_of"}`, d, up, fftest.NewUUID())
	}
	id := fftest.InsertCompletion(t, pool, fftest.Completion{Partition: p, ExecutionID: up, FlowID: flow, Outcome: "success"})

	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx) //nolint:errcheck
	if _, err := holder.Exec(ctx, `SELECT 1 FROM ff_edge_group WHERE partition_key = $1 AND downstream_eid = $2 FOR UPDATE`, p, downs[2]); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, pool.Config().ConnConfig.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := store.DispatchCompletion(ctx, conn, p, id, store.NowMs(), store.Filter{}, nil)
		done <- err
	}()
	waitForBackendLockWait(t, pool, conn.PgConn().PID())
	if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, conn.PgConn().PID()); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err == nil {
		t.Fatal("dispatch on a terminated connection succeeded")
	}
	if fftest.Dispatched(t, pool, p, id) {
		t.Fatal("the event stayed claimed after its dispatcher died: its remaining hops are lost")
	}
	for _, d := range downs {
		if g := fftest.ReadGroup(t, pool, p, flow, d); g.Success != 0 || g.Running != 2 {
			t.Fatalf("group %s changed by a dispatch that died: %+v", d, g)
		}
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	res := dispatch(t, pool, p, id)
	if len(res.Hops) != 3 {
		t.Fatalf("redispatch %+v", res)
	}
	for _, d := range downs {
		if g := fftest.ReadGroup(t, pool, p, flow, d); g.Success != 1 || g.Running != 1 {
			t.Fatalf("group %s after the redispatch: %+v, want each edge advanced once", d, g)
		}
	}
}

// TestDispatchLockTimeoutLeavesEventUnclaimed is FlowFabric's retry
// exhaustion scenario: the group stays locked past the dispatcher's lock
// timeout on every try. FlowFabric returns RetryExhausted with the claim
// committed (the hop lost); here the error comes back with nothing claimed.
func TestDispatchLockTimeoutLeavesEventUnclaimed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t).Pool
	f := newFlow(t, pool, 14, `{"kind":"all_of"}`, 1, "")
	id := f.emit(t, pool, 0, "success")
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx) //nolint:errcheck
	if _, err := holder.Exec(ctx, `SELECT 1 FROM ff_edge_group WHERE downstream_eid = $1 FOR UPDATE`, f.down); err != nil {
		t.Fatal(err)
	}
	cfg := pool.Config().ConnConfig.Copy()
	cfg.RuntimeParams["lock_timeout"] = "50ms"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	_, err = store.DispatchCompletion(ctx, conn, f.p, id, store.NowMs(), store.Filter{}, nil)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
		t.Fatalf("dispatch against a held group: %v, want lock_not_available", err)
	}
	if fftest.Dispatched(t, pool, f.p, id) {
		t.Fatal("event claimed although its hop failed")
	}
}

// TestDispatchSharesTheClaimWithFlowFabric: FlowFabric's own dispatcher
// claims with an autocommit UPDATE of dispatched_at_ms. Run while the
// fleet's dispatch of the event is open, it waits for the fleet's commit and
// then finds the event claimed, so the edges advance once. A regression is
// a FlowFabric claim that succeeds too (the group counted twice).
func TestDispatchSharesTheClaimWithFlowFabric(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t).Pool
	f := newFlow(t, pool, 15, `{"kind":"all_of"}`, 2, "")
	id := f.emit(t, pool, 0, "success")
	release := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := store.DispatchCompletion(ctx, pool, f.p, id, store.NowMs(), store.Filter{}, func(context.Context, pgx.Tx, store.CompletionResult) error {
			<-release
			return nil
		})
		done <- err
	}()
	ffClaim := make(chan int64, 1)
	go func() {
		// FlowFabric's claim (dispatch.rs dispatch_completion).
		tag, err := pool.Exec(ctx, `UPDATE ff_completion_event SET dispatched_at_ms = $2 WHERE event_id = $1 AND dispatched_at_ms IS NULL`, id, store.NowMs())
		if err != nil {
			t.Error(err)
		}
		ffClaim <- tag.RowsAffected()
	}()
	waitForLockWait(t, pool, "ff_completion_event")
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := <-ffClaim; n != 0 {
		t.Fatalf("FlowFabric's claim took %d rows after the fleet's dispatch committed", n)
	}
	if g := fftest.ReadGroup(t, pool, f.p, f.flow, f.down); g.Success != 1 || g.Running != 1 {
		t.Fatalf("group %+v", g)
	}
}

// waitForBackendLockWait waits until backend pid waits on a lock.
func waitForBackendLockWait(t *testing.T, db store.DB, pid uint32) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for fftest.Count(t, db, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'`, int32(pid)) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("backend %d never waited on a lock", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestDispatchCompletionsIsOneByOne: the events of a partition dispatched
// in one transaction (DispatchCompletions, as the fleet's coalescer runs
// them) write exactly what dispatching them one after another writes, on two
// copies of the same flows: groups sharing a batch (a pending hop then a
// deciding one, written set-based), an impossible downstream with its skip
// event, a missing group and a missing downstream, a sibling cancel and
// re-satisfactions (written statement by statement), satisfied groups alone
// (set-based, without skip events), a standalone execution,
// an event given twice and one already dispatched. A regression is a
// counter, flag, state or skip event that differs, or a result that does.
func TestDispatchCompletionsIsOneByOne(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t).Pool
	type copyOf struct {
		p       int16
		batches [][]int64
		groups  []flowFixture // flow and downstream of each group
	}
	build := func(p int16) copyOf {
		c := copyOf{p: p}
		a := newFlow(t, pool, p, `{"kind":"all_of"}`, 2, "acme")
		b := newFlow(t, pool, p, `{"kind":"all_of"}`, 1, "acme")
		d := newFlow(t, pool, p, `{"kind":"quorum","k":2,"on_satisfied":"let_run"}`, 3, "")
		e := newFlow(t, pool, p, `{"kind":"any_of","on_satisfied":"cancel_remaining"}`, 3, "")
		// a's first upstream also leads to a downstream without a group,
		// b's to a group without a downstream.
		fftest.InsertEdge(t, pool, p, a.flow, a.ups[0], fftest.NewUUID(), `{"kind":"all_of"}`)
		ghost := fftest.NewUUID()
		fftest.Link(t, pool, p, b.flow, `{"kind":"all_of"}`, ghost, b.ups[0])
		f1 := newFlow(t, pool, p, `{"kind":"all_of"}`, 1, "")
		f2 := newFlow(t, pool, p, `{"kind":"any_of","on_satisfied":"let_run"}`, 2, "")
		c.groups = []flowFixture{a, b, d, e, f1, f2, {flow: b.flow, down: ghost}}
		standalone := fftest.InsertExec(t, pool, fftest.Exec{Partition: p})
		done := fftest.InsertCompletion(t, pool, fftest.Completion{Partition: p, ExecutionID: standalone, Outcome: "success"})
		dispatch(t, pool, p, done)
		a0 := a.emit(t, pool, 0, "success")
		c.batches = [][]int64{
			{a0, b.emit(t, pool, 0, "failed"), a.emit(t, pool, 1, "success"), d.emit(t, pool, 0, "success"),
				d.emit(t, pool, 1, "failed"), d.emit(t, pool, 2, "success"), a0, done,
				fftest.InsertCompletion(t, pool, fftest.Completion{Partition: p, ExecutionID: standalone, Outcome: "success"})},
			{e.emit(t, pool, 0, "success"), e.emit(t, pool, 1, "success"), e.emit(t, pool, 2, "failed")},
			{f1.emit(t, pool, 0, "success"), f2.emit(t, pool, 0, "failed"), f2.emit(t, pool, 1, "success")},
		}
		return c
	}
	one, batched := build(31), build(32)
	type hopView struct {
		Decision                                    store.Decision
		Changed, Flagged, GroupMissing, DownMissing bool
		SkipEvent, OddPolicy                        bool
	}
	view := func(r store.CompletionResult) string {
		// Hops go in downstream order, which the two copies' random ids
		// do not share.
		hops := make([]string, len(r.Hops))
		for i, h := range r.Hops {
			hops[i] = fmt.Sprintf("%+v", hopView{h.Decision, h.Changed, h.Flagged, h.GroupMissing, h.DownstreamMissing, h.SkipEventID != 0, h.OddPolicy})
		}
		slices.Sort(hops)
		return fmt.Sprintf("%s %s %v %+v", r.Outcome, r.EventOutcome, r.UnknownOutcome, hops)
	}
	var got, want []string
	for _, batch := range one.batches {
		for _, id := range batch {
			want = append(want, view(dispatch(t, pool, one.p, id)))
		}
	}
	for _, batch := range batched.batches {
		res, err := store.DispatchCompletions(ctx, pool, batched.p, batch, store.NowMs(), store.Filter{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			got = append(got, view(r))
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("results in one transaction:\n%s\none by one:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	state := func(c copyOf) string {
		var b strings.Builder
		for _, g := range c.groups {
			gr := fftest.ReadGroup(t, pool, c.p, g.flow, g.down)
			fmt.Fprintf(&b, "group s%d f%d k%d r%d flag %v members %d\n", gr.Success, gr.Fail, gr.Skip, gr.Running, gr.Flag, len(gr.Members))
			if g.ups != nil {
				ex := fftest.ReadExec(t, pool, c.p, g.down)
				fmt.Fprintf(&b, "downstream %s %s %s %s %s %v\n", ex.LifecyclePhase, ex.EligibilityState, ex.PublicState,
					ex.AttemptState, fftest.Deref(ex.BlockingReason), ex.TerminalAtMs != nil)
			}
		}
		fmt.Fprintf(&b, "undispatched %d, skip events %d, pending cancels %d",
			fftest.Count(t, pool, `SELECT count(*) FROM ff_completion_event WHERE partition_key = $1 AND dispatched_at_ms IS NULL`, c.p),
			fftest.Count(t, pool, `SELECT count(*) FROM ff_completion_event WHERE partition_key = $1 AND outcome = 'skipped'
			   AND namespace = 'acme' AND instance_tag = 'i-acme'`, c.p),
			fftest.Count(t, pool, `SELECT count(*) FROM ff_pending_cancel_groups WHERE partition_key = $1`, c.p))
		return b.String()
	}
	if g, w := state(batched), state(one); g != w {
		t.Fatalf("rows after one transaction:\n%s\nafter one by one:\n%s", g, w)
	}
	t.Logf("%s", state(one))
}
