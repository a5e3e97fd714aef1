package bench

import (
	"context"
	"log/slog"
	"testing"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
)

// TestSeedsAreWhatTheSectionsCount: each section's seed writes, through
// ffseed, rows its own count then finds: the throughput scenarios' due rows
// (and none of the not-due ones), the lateness feeds' rows, the dependency
// section's chain and fresh events, and the idle section's not-due rows of
// every background duty. A seed that wrote the wrong state, deadline or
// table would have a section time a run over rows no reconciler acts on
// (or finish at once); this fails on the count instead.
func TestSeedsAreWhatTheSectionsCount(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const due, notDue = 30, 20

	for _, sc := range scenarios() {
		t.Run("Throughput/"+sc.name, func(t *testing.T) {
			t.Parallel()
			e := seedEnv(t)
			if err := sc.seed(ctx, e, due, notDue); err != nil {
				t.Fatal(err)
			}
			if n, err := sc.remaining(ctx, e.pool); err != nil || n != due {
				t.Fatalf("remaining = %d, %v; want the %d due rows", n, err, due)
			}
		})
	}
	// The ad-hoc lateness runs feed promotionLateness's rows and enqueue
	// their promotions, which needs River: the row seeds are these four.
	for _, lt := range []latenessRun{leaseLateness, suspensionLateness, promotionLateness, attemptLateness} {
		t.Run("Lateness/"+lt.name, func(t *testing.T) {
			t.Parallel()
			e := seedEnv(t)
			if err := lt.feed(ctx, e, due, store.NowMs()-1000); err != nil {
				t.Fatal(err)
			}
			if n, err := lt.remaining(ctx, e.pool); err != nil || n != due {
				t.Fatalf("remaining = %d, %v; want the %d rows fed", n, err, due)
			}
		})
	}
	t.Run("DependencyChain", func(t *testing.T) {
		t.Parallel()
		e := seedEnv(t)
		last, err := seedChain(ctx, e, 5)
		if err != nil {
			t.Fatal(err)
		}
		// One terminal upstream and five blocked hops, each hop's group
		// waiting on the one before; one event due, for the upstream.
		if n := fftest.Count(t, e.pool, `SELECT count(*) FROM ff_edge_group g
			JOIN ff_edge ed ON ed.partition_key = g.partition_key AND ed.downstream_eid = g.downstream_eid
			JOIN ff_exec_core x ON x.partition_key = g.partition_key AND x.execution_id = g.downstream_eid
			WHERE x.eligibility_state = 'blocked_by_dependencies' AND g.running_count = 1`); n != 5 {
			t.Fatalf("%d blocked hops with their edge and group; want 5", n)
		}
		if n := fftest.Count(t, e.pool, `SELECT count(*) FROM ff_completion_event ev
			JOIN ff_exec_core x ON x.partition_key = ev.partition_key AND x.execution_id = ev.execution_id
			WHERE x.lifecycle_phase = 'terminal' AND ev.outcome = 'failed' AND ev.dispatched_at_ms IS NULL
			  AND ev.committed_at_ms < $1`, store.NowMs()-60_000); n != 1 {
			t.Fatalf("%d due events of the terminal upstream; want 1", n)
		}
		if n := fftest.Count(t, e.pool, `SELECT count(*) FROM ff_edge WHERE downstream_eid = $1::uuid`, last); n != 1 {
			t.Fatalf("the last hop %s has %d edges; want 1", last, n)
		}
	})
	t.Run("DependencyFresh", func(t *testing.T) {
		t.Parallel()
		e := seedEnv(t)
		n, err := seedDependencyFresh(ctx, e, due)
		if err != nil || n != due {
			t.Fatalf("seedDependencyFresh = %d, %v; want %d", n, err, due)
		}
		// Each event's upstream is the one edge's, in its partition.
		if n := fftest.Count(t, e.pool, `SELECT count(*) FROM ff_completion_event ev
			JOIN ff_edge ed ON ed.partition_key = ev.partition_key AND ed.flow_id = ev.flow_id AND ed.upstream_eid = ev.execution_id
			JOIN ff_edge_group g ON g.partition_key = ed.partition_key AND g.downstream_eid = ed.downstream_eid
			WHERE ev.dispatched_at_ms IS NULL`); n != due {
			t.Fatalf("%d events with their edge and group; want %d", n, due)
		}
	})
	t.Run("IdleDuties", func(t *testing.T) {
		t.Parallel()
		e := seedEnv(t)
		if err := seedIdleTimers(ctx, e, due); err != nil {
			t.Fatal(err)
		}
		now := store.NowMs()
		for what, q := range map[string]string{
			"live claim grants of pending executions": `SELECT count(*) FROM ff_claim_grant g JOIN ff_exec_core x
				ON x.partition_key = g.partition_key AND x.execution_id = g.execution_id
				WHERE x.eligibility_state = 'pending_claim' AND g.expires_at_ms > $1`,
			"live quota admissions":    `SELECT count(*) FROM ff_quota_admitted WHERE expires_at_ms > $1`,
			"live budget dedup keys":   `SELECT count(*) FROM ff_budget_usage_dedup WHERE expires_at_ms > $1`,
			"backlogs requested later": `SELECT count(*) FROM ff_cancel_backlog WHERE requested_at_ms > $1 AND status = 'pending'`,
		} {
			if n := fftest.Count(t, e.pool, q, now); n != 1000 {
				t.Errorf("%d %s; want 1000", n, what)
			}
		}
	})
}

// seedEnv is an env on a test database of its own, enough for the seeds.
func seedEnv(t *testing.T) *env {
	t.Helper()
	return &env{pool: testdb.New(t).Pool, log: slog.New(slog.DiscardHandler)}
}
