package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/flowfabric/ffreconcile/internal/ffseed"
	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

// ---- suspension timeout ----

func seedSuspensions(ctx context.Context, e *env, n int, timeoutAt int64, jitter bool) error {
	raw := rawJSON(map[string]any{"namespace": "bench", "tags": map[string]string{"cairn.instance_id": "bench-1"},
		"bench_deadline_ms": timeoutAt})
	keys := randomKeys(n)
	return errors.Join(
		ffseed.InsertSeries(ctx, e.pool, n, func(i int) ffseed.Exec {
			return ffseed.Exec{Partition: keys[i].Partition, ID: keys[i].ExecutionID, FlowID: ffseed.NewUUID(), LaneID: "bench",
				LifecyclePhase: "suspended", OwnershipState: "unowned", PublicState: "suspended",
				AttemptState: "attempt_interrupted", CreatedAtMs: 1, RawFields: raw}
		}),
		ffseed.InsertSeries(ctx, e.pool, n, func(i int) ffseed.Suspension {
			return ffseed.Suspension{Partition: keys[i].Partition, ExecutionID: keys[i].ExecutionID, SuspendedAtMs: 1,
				TimeoutAtMs: ffseed.Ms(timeoutAt - jitterMs(jitter)), ReasonCode: "bench", Behavior: ffseed.Str("fail")}
		}))
}

var suspensionScenario = scenario{
	name: "suspension_timeout",
	seed: func(ctx context.Context, e *env, due, notDue int) error {
		now := store.NowMs()
		if err := seedSuspensions(ctx, e, due, now-5000, true); err != nil {
			return err
		}
		return seedSuspensions(ctx, e, notDue, now+3_600_000, true)
	},
	remaining: func(ctx context.Context, db store.DB) (int, error) {
		var n int
		err := db.QueryRow(ctx, `SELECT count(*) FROM ff_suspension_current WHERE timeout_at_ms < $1`, store.NowMs()).Scan(&n)
		return n, err
	},
	// The seed's scan_tick query (the behaviour column is read too).
	scan: scanKeys(`
			SELECT execution_id::text, 0 FROM ff_suspension_current
			 WHERE partition_key = $1 AND timeout_at_ms IS NOT NULL AND timeout_at_ms < $2
			 ORDER BY timeout_at_ms ASC LIMIT $3`),

	// The seed's expire_one for the fail behaviour.
	seedRow: func(ctx context.Context, tx pgx.Tx, p int16, k rowKey, now int64) error {
		var timeoutAt *int64
		var memberMap []byte
		err := tx.QueryRow(ctx, `SELECT timeout_at_ms, member_map FROM ff_suspension_current
			WHERE partition_key = $1 AND execution_id = $2 FOR UPDATE`, p, k.id).Scan(&timeoutAt, &memberMap)
		if err == pgx.ErrNoRows || timeoutAt == nil || *timeoutAt >= now {
			return nil
		}
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE ff_exec_core SET lifecycle_phase = 'terminal', ownership_state = 'unowned',
			eligibility_state = 'not_applicable', attempt_state = 'attempt_terminal', terminal_at_ms = $1,
			cancellation_reason = $2, raw_fields = raw_fields || jsonb_build_object('last_failure_message', 'suspension_timeout')
			WHERE partition_key = $3 AND execution_id = $4`, now, "suspension_timeout_fail", p, k.id); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM ff_suspension_current WHERE partition_key = $1 AND execution_id = $2`, p, k.id); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO ff_completion_event (partition_key, execution_id, flow_id, outcome, namespace, instance_tag, occurred_at_ms)
			SELECT partition_key, execution_id, flow_id, $3, NULL, NULL, $4 FROM ff_exec_core
			 WHERE partition_key = $1 AND execution_id = $2`, p, k.id, "expired", now)
		return err
	},
	setBased: func(ctx context.Context, db store.DB, p int16, now int64) error {
		_, err := db.Exec(ctx, `
			WITH su AS (
			    DELETE FROM ff_suspension_current
			     WHERE partition_key = $1 AND timeout_at_ms IS NOT NULL AND timeout_at_ms < $2
			    RETURNING execution_id
			), ec AS (
			    UPDATE ff_exec_core e SET lifecycle_phase = 'terminal', ownership_state = 'unowned',
			           eligibility_state = 'not_applicable', attempt_state = 'attempt_terminal', terminal_at_ms = $2,
			           cancellation_reason = 'suspension_timeout_fail',
			           raw_fields = e.raw_fields || jsonb_build_object('last_failure_message', 'suspension_timeout')
			      FROM su WHERE e.partition_key = $1 AND e.execution_id = su.execution_id
			    RETURNING e.execution_id, e.flow_id, e.raw_fields
			)
			INSERT INTO ff_completion_event (partition_key, execution_id, flow_id, outcome, namespace, instance_tag, occurred_at_ms)
			SELECT $1, execution_id, flow_id, 'expired', raw_fields->>'namespace', raw_fields->'tags'->>'cairn.instance_id', $2 FROM ec`, p, now)
		if err != nil {
			return fmt.Errorf("set-based suspension timeout in partition %d: %w", p, err)
		}
		return nil
	},
}

var suspensionLateness = latenessRun{
	name:       "suspension timeout",
	reconciler: workers.SuspensionTimeout.Name,
	feed: func(ctx context.Context, e *env, n int, deadlineMs int64) error {
		return seedSuspensions(ctx, e, n, deadlineMs, false)
	},
	remaining: func(ctx context.Context, db store.DB) (int, error) {
		var n int
		err := db.QueryRow(ctx, `SELECT count(*) FROM ff_suspension_current`).Scan(&n)
		return n, err
	},
	latencies: func(ctx context.Context, db store.DB) ([]float64, error) {
		return collectFloats(db.Query(ctx, `
			SELECT (ev.occurred_at_ms - (e.raw_fields->>'bench_deadline_ms')::bigint)::float8
			  FROM ff_completion_event ev
			  JOIN ff_exec_core e ON e.partition_key = ev.partition_key AND e.execution_id = ev.execution_id`))
	},
}

// ---- delayed promotion ----

// seedDelayed inserts n delayed executions that fall due at deadline (up
// to a second earlier with jitter) and returns their keys.
func seedDelayed(ctx context.Context, e *env, n int, deadline int64, jitter bool) ([]execKey, error) {
	raw := rawJSON(map[string]any{"namespace": "bench", "bench_deadline_ms": deadline})
	keys := randomKeys(n)
	err := ffseed.InsertSeries(ctx, e.pool, n, func(i int) ffseed.Exec {
		return ffseed.Exec{Partition: keys[i].Partition, ID: keys[i].ExecutionID, LaneID: "bench",
			LifecyclePhase: "runnable", OwnershipState: "unowned", EligibilityState: "not_eligible_until_time",
			PublicState: "delayed", AttemptState: "pending_retry_attempt", CreatedAtMs: 1,
			DeadlineAtMs: ffseed.Ms(deadline - jitterMs(jitter)), RawFields: raw}
	})
	return keys, err
}

var promotionScenario = scenario{
	name: "delayed_promotion",
	seed: func(ctx context.Context, e *env, due, notDue int) error {
		now := store.NowMs()
		if _, err := seedDelayed(ctx, e, due, now-5000, true); err != nil {
			return err
		}
		_, err := seedDelayed(ctx, e, notDue, now+3_600_000, true)
		return err
	},
	remaining: func(ctx context.Context, db store.DB) (int, error) {
		var n int
		err := db.QueryRow(ctx, `SELECT count(*) FROM ff_exec_core WHERE eligibility_state = 'not_eligible_until_time'
			AND deadline_at_ms <= $1`, store.NowMs()).Scan(&n)
		return n, err
	},
	// FlowFabric has no sweep on Postgres; the loop uses the sweep's scan.
	scan: scanKeys(`
			SELECT execution_id::text, 0 FROM ff_exec_core
			 WHERE partition_key = $1 AND deadline_at_ms IS NOT NULL AND deadline_at_ms <= $2
			   AND lifecycle_phase = 'runnable' AND eligibility_state = 'not_eligible_until_time'
			 ORDER BY deadline_at_ms ASC LIMIT $3`),

	// The seed's promote_for_execution.
	seedRow: func(ctx context.Context, tx pgx.Tx, p int16, k rowKey, now int64) error {
		var phase, elig string
		var until *int64
		err := tx.QueryRow(ctx, `SELECT lifecycle_phase, eligibility_state, deadline_at_ms FROM ff_exec_core
			WHERE partition_key = $1 AND execution_id = $2 FOR UPDATE`, p, k.id).Scan(&phase, &elig, &until)
		if err == pgx.ErrNoRows || phase != "runnable" || elig != "not_eligible_until_time" || until == nil || *until > now {
			return nil
		}
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE ff_exec_core SET eligibility_state = 'eligible_now', deadline_at_ms = NULL
			WHERE partition_key = $1 AND execution_id = $2`, p, k.id)
		return err
	},
	setBased: func(ctx context.Context, db store.DB, p int16, now int64) error {
		_, err := db.Exec(ctx, `UPDATE ff_exec_core SET eligibility_state = 'eligible_now', deadline_at_ms = NULL
			WHERE partition_key = $1 AND deadline_at_ms IS NOT NULL AND deadline_at_ms <= $2
			  AND lifecycle_phase = 'runnable' AND eligibility_state = 'not_eligible_until_time'`, p, now)
		if err != nil {
			return fmt.Errorf("set-based promotion in partition %d: %w", p, err)
		}
		return nil
	},
}

// Promotions leave no timestamp behind, so the lateness runs record the
// moment of the change with a trigger (created for these runs only).
const promotedTriggerSQL = `
CREATE TABLE IF NOT EXISTS bench_promoted (execution_id uuid NOT NULL, at_ms bigint NOT NULL);
CREATE OR REPLACE FUNCTION bench_mark_promoted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO bench_promoted VALUES (NEW.execution_id, (extract(epoch FROM clock_timestamp()) * 1000)::bigint);
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS bench_promoted ON ff_exec_core;
CREATE TRIGGER bench_promoted AFTER UPDATE ON ff_exec_core FOR EACH ROW
    WHEN (OLD.eligibility_state = 'not_eligible_until_time' AND NEW.eligibility_state = 'eligible_now')
    EXECUTE FUNCTION bench_mark_promoted();
TRUNCATE bench_promoted;`

func promotionLatencies(ctx context.Context, db store.DB) ([]float64, error) {
	return collectFloats(db.Query(ctx, `
		SELECT (b.at_ms - (e.raw_fields->>'bench_deadline_ms')::bigint)::float8
		  FROM bench_promoted b JOIN ff_exec_core e ON e.execution_id = b.execution_id`))
}

func delayedRemaining(ctx context.Context, db store.DB) (int, error) {
	var n int
	err := db.QueryRow(ctx, `SELECT count(*) FROM ff_exec_core WHERE eligibility_state = 'not_eligible_until_time'`).Scan(&n)
	return n, err
}

var promotionLateness = latenessRun{
	name:       "delayed promotion (sweep)",
	reconciler: workers.DelayedPromotion.Name,
	feed: func(ctx context.Context, e *env, n int, deadlineMs int64) error {
		if err := e.ensurePromotedTrigger(ctx); err != nil {
			return err
		}
		_, err := seedDelayed(ctx, e, n, deadlineMs, false)
		return err
	},
	remaining: delayedRemaining,
	latencies: promotionLatencies,
}

// adhocLateness: every delayed execution also gets an ad-hoc promotion job
// scheduled at its delay-until, with the sweep disabled.
var adhocLateness = latenessRun{
	name:       "ad-hoc promotion at delay-until (no sweep)",
	reconciler: workers.DelayedPromotion.Name,
	oneLead:    true,
	configure: func(c *fleet.Config) {
		c.Reconcilers = map[string]time.Duration{}
	},
	feed: func(ctx context.Context, e *env, n int, deadlineMs int64) error {
		if err := e.ensurePromotedTrigger(ctx); err != nil {
			return err
		}
		rows, err := seedDelayed(ctx, e, n, deadlineMs, false)
		if err != nil {
			return err
		}
		at := time.UnixMilli(deadlineMs)
		params := make([]river.InsertManyParams, len(rows))
		for i, r := range rows {
			p := r.Partition
			params[i] = river.InsertManyParams{Args: jobs.PromoteArgs{Partition: &p, ExecutionID: r.ExecutionID, At: &at}}
		}
		_, err = e.inserter.InsertMany(ctx, params)
		return err
	},
	remaining: delayedRemaining,
	latencies: promotionLatencies,
}

func (e *env) ensurePromotedTrigger(ctx context.Context) error {
	if e.promotedTrigger {
		return nil
	}
	if _, err := e.pool.Exec(ctx, promotedTriggerSQL); err != nil {
		return fmt.Errorf("create the promotion-time trigger: %w", err)
	}
	e.promotedTrigger = true
	return nil
}
