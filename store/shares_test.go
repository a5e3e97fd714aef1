package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
)

// TestSharesSplitExpiredLeases: when a fleet runs lease expiry and attempt
// timeout, each expired lease is due for exactly one of them. Over leases of
// active executions with every kind of retry policy (absent, 0, 1, many,
// past 32 bits, negative, fractional, a string, null), of executions not
// active, and of missing ones, lease expiry's share and attempt timeout's
// share are disjoint and together are every expired lease (scans, counts and
// partition probes alike, with and without a tenant filter); attempt
// timeout's share is exactly the active executions that ExpireAttempts then
// retries, so the scan and the action read a policy alike. A regression
// shows as a row due for both (two row jobs again), for neither (a lease
// never released), or a row left to attempt timeout that it ends at once
// (the scan reading max_retries otherwise than the action).
func TestSharesSplitExpiredLeases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t).Pool
	const now = int64(7_000_000)
	const p = int16(21)
	retries := func(v string) map[string]any {
		return map[string]any{"retry_policy": map[string]any{"max_retries": json.RawMessage(v)}}
	}
	type row struct {
		name   string
		exec   *fftest.Exec // nil: no execution row
		toTime bool         // attempt timeout's when both run
	}
	rows := []row{
		{name: "NoPolicy", exec: &fftest.Exec{}},
		{name: "NoRetryPolicy", exec: &fftest.Exec{Policy: map[string]any{"timeout_ms": 5}}},
		{name: "NoMaxRetries", exec: &fftest.Exec{Policy: map[string]any{"retry_policy": map[string]any{}}}},
		{name: "Zero", exec: &fftest.Exec{Policy: retries("0")}},
		{name: "One", exec: &fftest.Exec{Policy: retries("1")}, toTime: true},
		{name: "Three", exec: &fftest.Exec{Policy: retries("3")}, toTime: true},
		{name: "Exponent", exec: &fftest.Exec{Policy: retries("1e2")}, toTime: true}, // Postgres prints 100
		{name: "U32Max", exec: &fftest.Exec{Policy: retries("4294967295")}, toTime: true},
		{name: "PastU32", exec: &fftest.Exec{Policy: retries("4294967296")}},
		{name: "Negative", exec: &fftest.Exec{Policy: retries("-1")}},
		{name: "Fraction", exec: &fftest.Exec{Policy: retries("1.5")}},
		{name: "WholeFraction", exec: &fftest.Exec{Policy: retries("2.0")}},
		{name: "String", exec: &fftest.Exec{Policy: retries(`"2"`)}},
		{name: "Null", exec: &fftest.Exec{Policy: retries("null")}},
		{name: "Terminal", exec: &fftest.Exec{LifecyclePhase: "terminal", Policy: retries("3")}},
		{name: "Runnable", exec: &fftest.Exec{LifecyclePhase: "runnable", OwnershipState: "unowned", Policy: retries("3")}},
		{name: "Suspended", exec: &fftest.Exec{LifecyclePhase: "suspended", Policy: retries("3")}},
		{name: "MissingExecution"},
		{name: "OtherTenant", exec: &fftest.Exec{Namespace: "b", Policy: retries("2")}, toTime: true},
		{name: "OtherTenantNoRetries", exec: &fftest.Exec{Namespace: "b"}},
	}
	ids := map[string]string{} // id → case name
	var active []string
	wantTime := map[string]bool{}
	for i, r := range rows {
		id := fftest.NewUUID()
		if r.exec != nil {
			e := *r.exec
			e.Partition, e.ID = p, id
			if e.Namespace == "" {
				e.Namespace = "a"
			}
			fftest.InsertExec(t, pool, e)
			if e.LifecyclePhase == "" {
				active = append(active, id)
			}
		}
		fftest.InsertAttempt(t, pool, p, id, 0, fftest.Ms(now-100+int64(i)))
		ids[id] = r.name
		wantTime[id] = r.toTime
	}
	// Not due: a lease still running, and a released one.
	late := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, Policy: retries("3")})
	fftest.InsertAttempt(t, pool, p, late, 0, fftest.Ms(now+10))
	fftest.InsertAttempt(t, pool, p, late, 1, nil)

	keys := func(due *store.Due, f store.Filter) map[string]bool {
		t.Helper()
		got, err := due.Scan(ctx, pool, p, now, nil, 100, f)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for _, r := range got {
			out[r.ID] = true
		}
		return out
	}
	for _, f := range []store.Filter{{}, {Namespace: "a"}} {
		all := keys(store.ExpiredLeases, f)
		lease, timeout := keys(store.ExpiredLeasesShare, f), keys(store.TimedOutAttemptsShare, f)
		if f.Empty() && len(all) != len(rows) {
			t.Fatalf("%d expired leases; want %d", len(all), len(rows))
		}
		for id := range all {
			switch {
			case lease[id] && timeout[id]:
				t.Errorf("filter %+v: %s is due for both reconcilers", f, ids[id])
			case !lease[id] && !timeout[id]:
				t.Errorf("filter %+v: %s is due for neither", f, ids[id])
			case timeout[id] != wantTime[id]:
				t.Errorf("filter %+v: %s left to attempt timeout: %v; want %v", f, ids[id], timeout[id], wantTime[id])
			}
		}
		for id := range maps.Keys(lease) {
			if !all[id] {
				t.Errorf("filter %+v: lease expiry's share holds %s, not an expired lease", f, ids[id])
			}
		}
		for id := range maps.Keys(timeout) {
			if !all[id] {
				t.Errorf("filter %+v: attempt timeout's share holds %s, not an expired lease", f, ids[id])
			}
		}
		count := func(d *store.Due) int64 {
			c, err := d.Count(ctx, pool, now, f, 1000)
			if err != nil {
				t.Fatal(err)
			}
			return c.Due
		}
		if l, tt, a := count(store.ExpiredLeasesShare), count(store.TimedOutAttemptsShare), count(store.ExpiredLeases); l+tt != a ||
			l != int64(len(lease)) || tt != int64(len(timeout)) {
			t.Errorf("filter %+v: counts %d + %d; want %d + %d = %d", f, l, tt, len(lease), len(timeout), a)
		}
		for _, d := range []*store.Due{store.ExpiredLeasesShare, store.TimedOutAttemptsShare} {
			parts, err := d.Partitions(ctx, pool, store.NoLowerBound, now, 256, f)
			if err != nil || !slices.Equal(parts, []int16{p}) {
				t.Errorf("filter %+v: %s partitions = %v, %v; want [%d]", f, d.What, parts, err, p)
			}
		}
	}

	// The action reads the policy as the share does: every active
	// execution the share leaves to attempt timeout is retried, every other
	// ends.
	share := keys(store.TimedOutAttemptsShare, store.Filter{})
	refs := make([]store.LeaseRef, len(active))
	for i, id := range active {
		refs[i] = store.LeaseRef{ExecutionID: id}
	}
	res, err := store.ExpireAttempts(ctx, pool, p, refs, now, store.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		id := active[i]
		if !r.Applied || r.Retried != share[id] {
			t.Errorf("%s: ExpireAttempts = %+v; want applied, retried %v as the share reads its policy", ids[id], r, share[id])
		}
	}
}

// TestNarrowedScansKeepTheirIndexes: the narrowed due rows (lease expiry's
// and attempt timeout's shares, the dispatcher's pending groups) are read as
// their reconciler's full due rows are, under the settings of the pools that
// run them (scans: the work pool's custom plans without sequential scans;
// the tick's probe: the tick pool's generic plans): the scan (first batch,
// and a continuation under a tenant filter) and the probe read the table's
// deadline index, and the extra condition reads the execution or the edge
// group by its primary key, in the one child of the scanned partition. In a
// partition of 20,000 leases not yet due (and as many edge groups), a
// regression shows as a sequential scan, the not-due leases read, or a hash
// of every execution or edge group (how Postgres first planned the probe
// with the condition as NOT EXISTS).
func TestNarrowedScansKeepTheirIndexes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t).Pool
	const now = int64(9_000_000)
	const p = int16(41)
	if _, err := pool.Exec(ctx, `
		WITH src AS (
			SELECT $1::smallint AS partition_key, gen_random_uuid() AS execution_id, g AS n FROM generate_series(1, 20200) AS g
		), ex AS (
			INSERT INTO ff_exec_core (partition_key, execution_id, lane_id, lifecycle_phase, ownership_state,
			       eligibility_state, public_state, attempt_state, created_at_ms, policy, raw_fields)
			SELECT partition_key, execution_id, 'l', 'active', 'leased', 'not_applicable', 'running', 'running_attempt', 1,
			       CASE WHEN n % 2 = 0 THEN '{"retry_policy": {"max_retries": 2}}'::jsonb END, '{"namespace": "a"}'::jsonb
			  FROM src
		), att AS (
			INSERT INTO ff_attempt (partition_key, execution_id, attempt_index, lease_epoch, lease_expires_at_ms)
			SELECT partition_key, execution_id, 0, 1, CASE WHEN n <= 200 THEN $2 - n ELSE $2 + n END FROM src
		), grp AS (
			INSERT INTO ff_edge_group (partition_key, flow_id, downstream_eid, policy, cancel_siblings_pending_flag)
			SELECT partition_key, execution_id, execution_id, '{}'::jsonb, n % 2 = 0 FROM src
		)
		INSERT INTO ff_pending_cancel_groups (partition_key, flow_id, downstream_eid, enqueued_at_ms)
		SELECT partition_key, execution_id, execution_id, n FROM src WHERE n <= 200`, p, now); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE ff_exec_core, ff_attempt, ff_edge_group, ff_pending_cancel_groups`); err != nil {
		t.Fatal(err)
	}
	child := func(table string) string {
		var c string
		if err := pool.QueryRow(ctx, `SELECT tableoid::regclass::text FROM `+table+` WHERE partition_key = $1 LIMIT 1`, p).Scan(&c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	filter := store.Filter{Namespace: "a", TagKey: "k", TagValue: "v"}
	thousands := regexp.MustCompile(`actual rows=\d{4,}`)
	// The work pool's settings (internal/fleet), where scans run.
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, set := range []string{`SET plan_cache_mode = force_custom_plan`, `SET enable_seqscan = off`} {
		if _, err := conn.Exec(ctx, set); err != nil {
			t.Fatal(err)
		}
	}
	// The tick pool's, where probes run: generic plans.
	tick, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tick.Release()
	if _, err := tick.Exec(ctx, `SET plan_cache_mode = force_generic_plan`); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		due   *store.Due
		index string
		// pkeys are the tables the condition reads by primary key.
		pkeys []string
	}{
		{store.ExpiredLeasesShare, child("ff_attempt") + "_partition_key_lease_expires_at_ms_idx", []string{"ff_exec_core"}},
		{store.TimedOutAttemptsShare, child("ff_attempt") + "_partition_key_lease_expires_at_ms_idx", []string{"ff_exec_core"}},
		{store.DispatchableCancelGroups, child("ff_pending_cancel_groups") + "_partition_key_enqueued_at_ms_idx", []string{"ff_edge_group"}},
	} {
		t.Run(tc.due.What, func(t *testing.T) {
			ex := &explainDB{DB: conn}
			if _, err := tc.due.Scan(ctx, ex, p, now, nil, 1000, store.Filter{}); err != nil {
				t.Fatal(err)
			}
			if _, err := tc.due.Scan(ctx, ex, p, now, &store.DueRow{AtMs: 1, ID: "00000000-0000-4000-8000-000000000000", ID2: "00000000-0000-4000-8000-000000000000"}, 1000, filter); err != nil {
				t.Fatal(err)
			}
			gen := &genericExplainDB{conn: tick}
			if _, err := tc.due.Partitions(ctx, gen, store.NoLowerBound, now, 256, store.Filter{}); err != nil {
				t.Fatal(err)
			}
			ex.plans = append(ex.plans, gen.plans...)
			for i, plan := range ex.plans {
				// A probe of rows due as soon as they exist has no range to
				// read: it takes a partition's first row either way.
				probeAlways := i == 2 && tc.due.Always
				if !probeAlways && !strings.Contains(plan, "Index Scan using "+tc.index) {
					t.Errorf("plan %d does not read %s:\n%s", i, tc.index, plan)
				}
				for _, table := range tc.pkeys {
					if !strings.Contains(plan, child(table)+"_pkey on "+child(table)) {
						t.Errorf("plan %d does not read %s by its primary key:\n%s", i, table, plan)
					}
				}
				// The probe's plan covers all 256 children; empty ones may be
				// planned as (never executed) sequential scans.
				t.Logf("plan %d:\n%s", i, plan)
				if i < 2 {
					if strings.Contains(plan, "Seq Scan") {
						t.Errorf("plan %d scans sequentially:\n%s", i, plan)
					}
					if thousands.MatchString(plan) {
						t.Errorf("plan %d reads thousands of rows:\n%s", i, plan)
					}
				}
			}
		})
	}
}

// genericExplainDB runs a query as a prepared statement's generic plan,
// as the tick pool (force_generic_plan) does, under EXPLAIN ANALYZE, keeps
// the plan and returns no rows.
type genericExplainDB struct {
	conn  *pgxpool.Conn
	plans []string
}

func (d *genericExplainDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if _, err := d.conn.Exec(ctx, "PREPARE generic_probe AS "+sql); err != nil {
		return nil, err
	}
	// EXECUTE's arguments as literals, each coerced to its parameter's type.
	lit := make([]string, len(args))
	for i, a := range args {
		lit[i] = "'" + strings.ReplaceAll(fmt.Sprint(a), "'", "''") + "'"
	}
	rows, err := d.conn.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS OFF, TIMING OFF, SUMMARY OFF) EXECUTE generic_probe("+strings.Join(lit, ", ")+")")
	if err != nil {
		return nil, err
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	d.plans = append(d.plans, strings.Join(lines, "\n"))
	if _, err := d.conn.Exec(ctx, "DEALLOCATE generic_probe"); err != nil {
		return nil, err
	}
	return d.conn.Query(ctx, `SELECT NULL::smallint WHERE false`)
}

func (d *genericExplainDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	panic("genericExplainDB: QueryRow is not explained")
}

func (d *genericExplainDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	panic("genericExplainDB: Exec is not explained")
}
