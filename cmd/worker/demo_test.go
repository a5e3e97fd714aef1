package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flowfabric/ffreconcile/internal/demo"
	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/internal/fleettest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

func TestDemoOnceSeedsEveryKind(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	// One deck exactly.
	code, out, stderr := runMain(t, context.Background(), "demo", "--once", "--malformed", "--rate", strconv.Itoa(demo.DeckSize), "--database-url", db.URL)
	if code != 0 || !strings.HasPrefix(out, fmt.Sprintf("demo: inserted %d items", demo.DeckSize)) {
		t.Fatalf("worker demo --once: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	count := func(sql string) int { return fftest.Count(t, db.Pool, sql) }

	// One deck: 3 expired + 2 expiring leases, 7 suspensions (one per
	// behaviour), 3 delayed, 2 cancel groups, 1 orphan and 1 stale pending,
	// and one each of a passing deadline (leased for minutes: a sixth
	// lease), an expiring waitpoint (of an eighth suspension, timing out
	// after it), a budget due, a stale worker, a flow step, a claim grant,
	// a full quota policy (two admissions), a budget dedup key and a cancel
	// backlog.
	checks := []struct {
		what string
		sql  string
		want int
	}{
		{"leases", `SELECT count(*) FROM ff_attempt a JOIN ff_exec_core e USING (partition_key, execution_id)
		   WHERE a.lease_expires_at_ms IS NOT NULL AND e.lifecycle_phase = 'active' AND e.ownership_state = 'leased'`, 6},
		// Expired when inserted: the demo starts each attempt 30 s before
		// its now. (Compared with the clock, the expiring ones count too
		// once a slow run reaches this check.)
		{"expired leases", `SELECT count(*) FROM ff_attempt WHERE lease_expires_at_ms < started_at_ms + 30000`, 3},
		{"suspensions", `SELECT count(*) FROM ff_suspension_current s JOIN ff_exec_core e USING (partition_key, execution_id)
		   WHERE s.timeout_at_ms IS NOT NULL AND e.lifecycle_phase = 'suspended'`, 8},
		{"behaviours", `SELECT count(DISTINCT COALESCE(timeout_behavior, 'NULL')) FROM ff_suspension_current`, 7},
		{"NULL behaviour", `SELECT count(*) FROM ff_suspension_current WHERE timeout_behavior IS NULL`, 1},
		{"unknown behaviour", `SELECT count(*) FROM ff_suspension_current WHERE timeout_behavior = '` + demo.UnknownBehavior + `'`, 1},
		{"delayed", `SELECT count(*) FROM ff_exec_core WHERE lifecycle_phase = 'runnable'
		   AND eligibility_state = 'not_eligible_until_time' AND deadline_at_ms IS NOT NULL`, 3},
		{"flagged groups", `SELECT count(*) FROM ff_edge_group g JOIN ff_pending_cancel_groups USING (partition_key, flow_id, downstream_eid)
		   WHERE g.cancel_siblings_pending_flag AND cardinality(g.cancel_siblings_pending_members) >= 2`, 2},
		{"members not live siblings", `SELECT count(*) FROM ff_edge_group g, unnest(g.cancel_siblings_pending_members) AS m
		   WHERE NOT EXISTS (SELECT 1 FROM ff_exec_core e WHERE e.partition_key = g.partition_key
		      AND e.execution_id = m::uuid AND e.flow_id = g.flow_id AND e.lifecycle_phase NOT IN ('terminal', 'cancelled'))`, 0},
		{"orphan pending", `SELECT count(*) FROM ff_pending_cancel_groups p WHERE NOT EXISTS (SELECT 1 FROM ff_edge_group g
		   WHERE (g.partition_key, g.flow_id, g.downstream_eid) = (p.partition_key, p.flow_id, p.downstream_eid))`, 1},
		{"flag-false pending", `SELECT count(*) FROM ff_pending_cancel_groups JOIN ff_edge_group g USING (partition_key, flow_id, downstream_eid)
		   WHERE NOT g.cancel_siblings_pending_flag`, 1},
		{"deadlines", `SELECT count(*) FROM ff_exec_core WHERE lifecycle_phase = 'active' AND deadline_at_ms IS NOT NULL`, 1},
		{"waitpoints", `SELECT count(*) FROM ff_waitpoint_pending w JOIN ff_suspension_current s USING (partition_key, execution_id)
		   WHERE w.expires_at_ms < s.timeout_at_ms`, 1},
		{"budget usage", `SELECT count(*) FROM ff_budget_usage u JOIN ff_budget_policy p USING (partition_key, budget_id)
		   WHERE p.next_reset_at_ms IS NOT NULL AND u.current_value > 0`, 2},
		{"workers", `SELECT count(*) FROM ff_worker_registry WHERE namespace = 'demo'`, 1},
		{"flow steps", `SELECT count(*) FROM ff_completion_event ev WHERE dispatched_at_ms IS NULL AND namespace = 'demo'
		   AND instance_tag = 'demo-1' AND (SELECT count(*) FROM ff_edge e WHERE e.flow_id = ev.flow_id) = 2`, 1},
		{"claim grants", `SELECT count(*) FROM ff_claim_grant g JOIN ff_exec_core e USING (partition_key, execution_id)
		   WHERE e.eligibility_state = 'pending_claim'`, 1},
		{"quota admissions", `SELECT count(*) FROM ff_quota_admitted a JOIN ff_quota_policy p USING (partition_key, quota_policy_id)
		   WHERE p.active_concurrency = 2 AND a.execution_id LIKE '{fp:%}:%'`, 2},
		{"quota window rows", `SELECT count(*) FROM ff_quota_window`, 2},
		{"budget dedup keys", `SELECT count(*) FROM ff_budget_usage_dedup`, 1},
		{"cancel backlogs", `SELECT count(*) FROM ff_cancel_backlog b JOIN ff_flow_core f USING (partition_key, flow_id)
		   JOIN ff_cancel_backlog_member m USING (partition_key, flow_id)
		   JOIN ff_exec_core e ON e.partition_key = m.partition_key AND '{fp:' || e.partition_key || '}:' || e.execution_id = m.execution_id
		   WHERE e.lifecycle_phase = 'runnable' AND f.public_flow_state = 'cancelled'`, 1},
		{"executions outside the demo tenant", `SELECT count(*) FROM ff_exec_core
		   WHERE raw_fields->>'namespace' IS DISTINCT FROM 'demo' OR raw_fields->'tags'->>'cairn.instance_id' IS DISTINCT FROM 'demo-1'`, 0},
	}
	for _, c := range checks {
		if got := count(c.sql); got != c.want {
			t.Errorf("%s: %d; want %d", c.what, got, c.want)
		}
	}
	// Random partitions: 20 items over 256 partitions land in many.
	if n := count(`SELECT count(DISTINCT partition_key) FROM ff_exec_core`); n < 8 {
		t.Errorf("executions in %d partitions; want them spread", n)
	}
}

func TestDemoFeedsUntilDuration(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	code, out, stderr := runMain(t, context.Background(), "demo", "--rate", "40", "--duration", "1500ms", "--database-url", db.URL)
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 2 || !strings.HasPrefix(lines[0], "demo: +") || !strings.HasPrefix(lines[len(lines)-1], "demo: stopped after ") {
		t.Fatalf("output %q; want per-second lines then a total", out)
	}
	if n := fftest.Count(t, db.Pool, `SELECT count(*) FROM ff_exec_core`); n == 0 {
		t.Fatal("no executions inserted")
	}
	code, _, stderr = runMain(t, context.Background(), "demo", "--rate", "0", "--database-url", db.URL)
	if code != 2 || !strings.Contains(stderr, "--rate must be in 1..10000") {
		t.Errorf("--rate 0: exit %d, stderr %q; want usage error", code, stderr)
	}
}

// TestDemoRowsGetReconciled runs a fleet with every reconciler over a demo
// batch and checks each one's effect; a reconciler without a check fails
// the test, so the demo keeps up with the registry. It runs on the schema
// `worker migrate --ff-schema` builds and on one FlowFabric's own
// migrations built.
func TestDemoRowsGetReconciled(t *testing.T) {
	t.Parallel()
	testdb.EachSchema(t, func(t *testing.T, db *testdb.DB) {
		demoRowsGetReconciled(t, db)
	})
}

func demoRowsGetReconciled(t *testing.T, db *testdb.DB) {
	ctx := context.Background()
	// Dealt ten seconds in the past, every deadline has already passed:
	// the fleet can act at once, and the test waits on no clock.
	c, err := demo.NewFeeder(db.Pool, 7).Insert(ctx, 2*demo.DeckSize, time.Now().Add(-10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	fleettest.Start(t, db, fleet.Config{
		Reconcilers: fleettest.Fast(fleettest.DefaultOn()...),
		Filter:      store.Filter{Namespace: demo.Namespace, TagKey: demo.InstanceTagKey, TagValue: demo.InstanceTag},
		// The primary dispatcher: completion events are due at once, so
		// the test waits on no stale threshold.
		Settings: workers.Values{workers.DependencyStaleThreshold: workers.Off},
	})

	// Whole-table reads lock every one of 256 partitions; on a test server
	// with few lock slots, shared by parallel tests, one can fail with "out
	// of shared memory". A failed read here means "not yet", not a failure:
	// the poll tries again.
	var readErr error
	count := func(sql string) int {
		var n int
		if err := db.Pool.QueryRow(ctx, sql).Scan(&n); err != nil {
			readErr = err
			return -1
		}
		return n
	}
	due := func(r *workers.Reconciler) int64 {
		dc, err := r.Due.Count(ctx, db.Pool, store.NowMs(), store.Filter{}, 10_000)
		if err != nil {
			readErr = err
			return -1
		}
		return dc.Due
	}
	leases := c.Items[demo.LeaseExpired] + c.Items[demo.LeaseExpiring]
	checks := map[*workers.Reconciler]func() (bool, string){
		// An expired lease on an active execution is due for lease expiry
		// or attempt timeout (see below): each is released once, with one
		// expired lease event; an execution reaching its deadline gets one
		// too.
		workers.LeaseExpiry: func() (bool, string) {
			n, ev := due(workers.LeaseExpiry), count(`SELECT count(*) FROM ff_lease_event WHERE event_type = 'expired' AND namespace = 'demo'`)
			want := leases + c.Items[demo.DeadlinePassing]
			return n == 0 && ev == want, fleettest.Statusf("%d leases due, %d expired events of %d", n, ev, want)
		},
		workers.AttemptTimeout: func() (bool, string) {
			// The default fleet splits them by retry policy, each with its
			// reconciler's whole action: the expired leases (no policy) are
			// lease expiry's, the expiring ones (two retries) attempt
			// timeout's, which retries them.
			released := func(outcome, attemptState, policy string) int {
				return count(`SELECT count(*) FROM ff_attempt a JOIN ff_exec_core e USING (partition_key, execution_id)
				   WHERE a.lease_expires_at_ms IS NULL AND a.outcome = '` + outcome + `'
				     AND e.attempt_state = '` + attemptState + `' AND e.policy IS ` + policy)
			}
			byLease := released("lease_expired_reclaimable", "attempt_interrupted", "NULL")
			byTimeout := released("interrupted", "pending_retry_attempt", "NOT NULL")
			return due(workers.AttemptTimeout) == 0 && byLease == c.Items[demo.LeaseExpired] && byTimeout == c.Items[demo.LeaseExpiring],
				fleettest.Statusf("%d of %d expired leases released by lease expiry, %d of %d expiring ones by attempt timeout",
					byLease, c.Items[demo.LeaseExpired], byTimeout, c.Items[demo.LeaseExpiring])
		},
		workers.ExecutionDeadline: func() (bool, string) {
			expired := count(`SELECT count(*) FROM ff_exec_core WHERE lifecycle_phase = 'terminal'
			   AND raw_fields->>'last_failure_message' = 'execution_deadline'`)
			want := c.Items[demo.DeadlinePassing]
			return expired == want, fleettest.Statusf("%d of %d executions expired at their deadline", expired, want)
		},
		workers.WaitpointExpiry: func() (bool, string) {
			left := count(`SELECT count(*) FROM ff_waitpoint_pending`)
			marked := count(`SELECT count(*) FROM ff_suspension_current WHERE member_map->'approval'->>'status' = 'never_committed'`)
			want := c.Items[demo.WaitpointExpiring]
			return left == 0 && marked == want, fleettest.Statusf("%d waitpoints left, %d of %d suspensions marked", left, marked, want)
		},
		workers.BudgetReset: func() (bool, string) {
			zeroed := count(`SELECT count(*) FROM ff_budget_usage WHERE current_value = 0 AND last_reset_at_ms IS NOT NULL`)
			want := 2 * c.Items[demo.BudgetDue]
			return zeroed == want && due(workers.BudgetReset) == 0, fleettest.Statusf("%d of %d usage rows reset", zeroed, want)
		},
		workers.WorkerRegistryTTL: func() (bool, string) {
			left := count(`SELECT count(*) FROM ff_worker_registry`)
			swept := count(`SELECT count(*) FROM ff_worker_registry_event WHERE event_kind = 'ttl_swept'`)
			want := c.Items[demo.WorkerStale]
			return left == 0 && swept == want, fleettest.Statusf("%d registrations left, %d of %d swept", left, swept, want)
		},
		workers.SuspensionTimeout: func() (bool, string) {
			// Auto-resume keeps its suspension with the timeout cleared;
			// every other behaviour deletes it. Suspensions waiting on a
			// waitpoint time out demo.WaitpointSuspensionTimeout later.
			n, left := due(workers.SuspensionTimeout), count(`SELECT count(*) FROM ff_suspension_current`)
			want := c.Behaviors["auto_resume_with_timeout_signal"] + c.Items[demo.WaitpointExpiring]
			return n == 0 && left == want, fleettest.Statusf("%d due, %d suspensions left (want %d)", n, left, want)
		},
		workers.DelayedPromotion: func() (bool, string) {
			// The demo's delayed executions (public state delayed) are
			// promoted: eligible now, their delay-until cleared, waiting
			// for a worker, their attempt state kept (attempt timeout's
			// retried executions look alike but carry a retry policy).
			promoted := count(`SELECT count(*) FROM ff_exec_core WHERE public_state = 'waiting'
			   AND blocking_reason = 'waiting_for_worker' AND policy IS NULL
			   AND lifecycle_phase = 'runnable' AND eligibility_state = 'eligible_now' AND deadline_at_ms IS NULL
			   AND attempt_state = 'pending_retry_attempt'`)
			want := c.Items[demo.Delayed]
			return promoted == want, fleettest.Statusf("%d of %d delayed executions promoted", promoted, want)
		},
		workers.CancelDispatch: func() (bool, string) {
			flagged := count(`SELECT count(*) FROM ff_edge_group WHERE cancel_siblings_pending_flag`)
			cancelled := count(`SELECT count(*) FROM ff_exec_core WHERE cancellation_reason = 'sibling_quorum_satisfied'`)
			return flagged == 0 && cancelled == c.Siblings,
				fleettest.Statusf("%d groups flagged, %d of %d siblings cancelled", flagged, cancelled, c.Siblings)
		},
		// Every demo completion event dispatched: a succeeded upstream's
		// downstream eligible, a failed one's downstream and the one after
		// it skipped (the chain), each skipped event dispatched too.
		workers.Dependency: func() (bool, string) {
			left := count(`SELECT count(*) FROM ff_completion_event WHERE dispatched_at_ms IS NULL AND flow_id IS NOT NULL`)
			eligible := count(`SELECT count(*) FROM ff_exec_core WHERE lifecycle_phase = 'runnable' AND eligibility_state = 'eligible_now'
			   AND public_state = 'waiting' AND attempt_state = 'pending' AND flow_id IN (SELECT flow_id FROM ff_edge)`)
			skipped := count(`SELECT count(*) FROM ff_exec_core WHERE public_state = 'skipped'`)
			ok := c.Items[demo.FlowStep] - c.FlowsFailed
			return left == 0 && eligible == ok && skipped == 2*c.FlowsFailed,
				fleettest.Statusf("%d undispatched, %d of %d downstreams eligible, %d of %d skipped", left, eligible, ok, skipped, 2*c.FlowsFailed)
		},
		// Every demo flow summarised as its members stand once the
		// dependency cascade is done: three members, the upstream ended
		// and its downstreams eligible (waiting) or skipped.
		workers.FlowSummary: func() (bool, string) {
			flows := count(`SELECT count(*) FROM ff_flow_core WHERE public_flow_state = 'open'`)
			right := count(`SELECT count(*) FROM ff_flow_summary s JOIN ff_flow_core fc USING (partition_key, flow_id)
			   WHERE fc.public_flow_state = 'open' AND s.total_members = 3 AND s.members_completed + s.members_failed = 1
			     AND s.members_waiting + s.members_skipped = 2
			     AND s.members_skipped = (SELECT count(*) FROM ff_exec_core e
			          WHERE e.partition_key = s.partition_key AND e.flow_id = s.flow_id AND e.public_state = 'skipped')`)
			want := c.Items[demo.FlowStep]
			return flows == want && right == want, fleettest.Statusf("%d of %d flows summarised as their members stand", right, want)
		},
		// Every grant gone and its execution eligible again, waiting for a
		// worker (no worker claims in the demo).
		workers.ClaimGrantExpiry: func() (bool, string) {
			grants := count(`SELECT count(*) FROM ff_claim_grant`)
			reset := count(`SELECT count(*) FROM ff_exec_core WHERE attempt_state = 'pending_first_attempt'
			   AND lifecycle_phase = 'runnable' AND eligibility_state = 'eligible_now'
			   AND public_state = 'waiting' AND blocking_reason = 'waiting_for_worker'`)
			want := c.Items[demo.GrantExpiring]
			return grants == 0 && reset == want, fleettest.Statusf("%d grants left, %d of %d executions eligible again", grants, reset, want)
		},
		// Every admission and window row gone, every policy's counter back
		// to zero.
		workers.QuotaReconcile: func() (bool, string) {
			left := count(`SELECT (SELECT count(*) FROM ff_quota_admitted) + (SELECT count(*) FROM ff_quota_window)`)
			zeroed := count(`SELECT count(*) FROM ff_quota_policy WHERE active_concurrency = 0`)
			want := c.Items[demo.AdmissionExpiring]
			return left == 0 && zeroed == want, fleettest.Statusf("%d admission and window rows left, %d of %d policies at 0", left, zeroed, want)
		},
		workers.BudgetDedupExpiry: func() (bool, string) {
			left := count(`SELECT count(*) FROM ff_budget_usage_dedup`)
			return left == 0, fleettest.Statusf("%d of %d dedup keys left", left, c.Items[demo.DedupExpiring])
		},
		// Every demo backlog drained: its member cancelled as FlowFabric's
		// operator cancel does, its rows gone.
		workers.CancelBacklog: func() (bool, string) {
			left := count(`SELECT count(*) FROM ff_cancel_backlog`) + count(`SELECT count(*) FROM ff_cancel_backlog_member`)
			cancelled := count(`SELECT count(*) FROM ff_exec_core WHERE cancelled_by = 'operator_override' AND cancellation_reason = 'demo cancel'`)
			want := c.Items[demo.CancelBacklog]
			return left == 0 && cancelled == want, fleettest.Statusf("%d backlog rows left, %d of %d members cancelled", left, cancelled, want)
		},
		workers.CancelReconcile: func() (bool, string) {
			stale := count(`SELECT count(*) FROM ff_pending_cancel_groups p WHERE NOT EXISTS (
			   SELECT 1 FROM ff_edge_group g WHERE (g.partition_key, g.flow_id, g.downstream_eid) = (p.partition_key, p.flow_id, p.downstream_eid)
			      AND g.cancel_siblings_pending_flag)`)
			return stale == 0, fleettest.Statusf("%d orphan or flag-less pending rows", stale)
		},
	}
	for _, r := range fleettest.DefaultOn() {
		check, ok := checks[r]
		if !ok {
			t.Fatalf("no check of %s's demo rows", r.Name)
		}
		fleettest.WaitFor(t, fleettest.Patient, r.Name+" to reconcile the demo rows", func() (bool, string) {
			readErr = nil
			ok, status := check()
			if readErr != nil {
				return false, fleettest.Statusf("%s (read error: %v)", status, readErr)
			}
			return ok, status
		})
	}
}
