package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flowfabric/ffreconcile/internal/ffseed"
	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

// Lease expiry and attempt timeout act on the same rows (an expired lease
// on an active execution; see docs/design.md): each one's runs leave the
// other out, so a run measures one action on every row.
var (
	withoutAttemptTimeout = without(workers.AttemptTimeout)
	withoutLeaseExpiry    = without(workers.LeaseExpiry)
)

// without enables every reconciler but the given ones (and retention, off
// by default), at its default interval.
func without(off ...*workers.Reconciler) func(*fleet.Config) {
	return func(c *fleet.Config) {
		c.Reconcilers = map[string]time.Duration{}
		for _, r := range workers.DefaultOn(nil) {
			if !slices.Contains(off, r) {
				c.Reconcilers[r.Name] = r.Interval
			}
		}
	}
}

// seedAttempts inserts n active executions whose attempt's lease expires at
// expiresMs (minus up to a second of jitter when jitter), in the bench
// tenant; every third one has retries left (max_retries 3), the others are
// on their last attempt.
func seedAttempts(ctx context.Context, e *env, n int, expiresMs int64, jitter bool, rawFields map[string]any) error {
	raw := map[string]any{"namespace": "bench", "tags": map[string]string{"cairn.instance_id": "bench-1"}}
	for k, v := range rawFields {
		raw[k] = v
	}
	fields := rawJSON(raw)
	keys := randomKeys(n)
	return errors.Join(
		ffseed.InsertSeries(ctx, e.pool, n, func(i int) ffseed.Exec {
			x := ffseed.Exec{Partition: keys[i].Partition, ID: keys[i].ExecutionID, LaneID: "bench", CreatedAtMs: 1,
				RawFields: fields}
			if i%3 == 2 {
				x.Policy = json.RawMessage(`{"retry_policy": {"max_retries": 3}}`)
			}
			return x
		}),
		ffseed.InsertSeries(ctx, e.pool, n, func(i int) ffseed.Attempt {
			return ffseed.Attempt{Partition: keys[i].Partition, ExecutionID: keys[i].ExecutionID, WorkerID: "bench-worker",
				LeaseEpoch: 1, LeaseExpiresAtMs: ffseed.Ms(expiresMs - jitterMs(jitter))}
		}))
}

var attemptScenario = scenario{
	name:      workers.AttemptTimeout.Name,
	configure: withoutLeaseExpiry,
	seed: func(ctx context.Context, e *env, due, notDue int) error {
		now := store.NowMs()
		if due > 0 {
			if err := seedAttempts(ctx, e, due, now-5000, true, nil); err != nil {
				return err
			}
		}
		if notDue > 0 {
			return seedAttempts(ctx, e, notDue, now+3_600_000, true, nil)
		}
		return nil
	},
	remaining: func(ctx context.Context, db store.DB) (int, error) {
		var n int
		err := db.QueryRow(ctx, `SELECT count(*) FROM ff_attempt WHERE lease_expires_at_ms < $1`, store.NowMs()).Scan(&n)
		return n, err
	},
	// FlowFabric's attempt_timeout scan_tick query.
	scan: scanKeys(`
			SELECT a.execution_id::text, a.attempt_index FROM ff_attempt a
			  JOIN ff_exec_core c ON c.partition_key = a.partition_key AND c.execution_id = a.execution_id
			 WHERE a.partition_key = $1 AND a.lease_expires_at_ms IS NOT NULL AND a.lease_expires_at_ms < $2
			   AND c.lifecycle_phase = 'active'
			 ORDER BY a.lease_expires_at_ms ASC LIMIT $3`),
	// FlowFabric's expire_one: lock and re-check the attempt, then the
	// execution, read its retry policy, interrupt the attempt, retry or end
	// the execution (with its completion event), write the lease event.
	seedRow: func(ctx context.Context, tx pgx.Tx, p int16, k rowKey, now int64) error {
		var exp *int64
		err := tx.QueryRow(ctx, `SELECT lease_expires_at_ms FROM ff_attempt
			WHERE partition_key = $1 AND execution_id = $2 AND attempt_index = $3 FOR UPDATE`, p, k.id, k.n).Scan(&exp)
		if err == pgx.ErrNoRows || exp == nil || *exp >= now {
			return nil
		}
		if err != nil {
			return err
		}
		var (
			attempt int32
			phase   string
			policy  []byte
		)
		err = tx.QueryRow(ctx, `SELECT attempt_index, lifecycle_phase, policy FROM ff_exec_core
			WHERE partition_key = $1 AND execution_id = $2 FOR UPDATE`, p, k.id).Scan(&attempt, &phase, &policy)
		if err == pgx.ErrNoRows || phase != "active" {
			return nil
		}
		if err != nil {
			return err
		}
		var pol struct {
			RetryPolicy struct {
				MaxRetries *uint32 `json:"max_retries"`
			} `json:"retry_policy"`
		}
		_ = json.Unmarshal(policy, &pol)
		var maxRetries uint32
		if pol.RetryPolicy.MaxRetries != nil {
			maxRetries = *pol.RetryPolicy.MaxRetries
		}
		if _, err := tx.Exec(ctx, `UPDATE ff_attempt SET outcome = 'interrupted', lease_expires_at_ms = NULL, terminal_at_ms = $1
			WHERE partition_key = $2 AND execution_id = $3 AND attempt_index = $4`, now, p, k.id, k.n); err != nil {
			return err
		}
		if int64(attempt) < int64(maxRetries) {
			if _, err := tx.Exec(ctx, `UPDATE ff_exec_core SET lifecycle_phase = 'runnable', ownership_state = 'unowned',
				eligibility_state = 'eligible_now', attempt_state = 'pending_retry_attempt', attempt_index = attempt_index + 1,
				raw_fields = raw_fields || jsonb_build_object('last_failure_message', 'attempt_timeout')
				WHERE partition_key = $1 AND execution_id = $2`, p, k.id); err != nil {
				return err
			}
		} else {
			if _, err := tx.Exec(ctx, `UPDATE ff_exec_core SET lifecycle_phase = 'terminal', ownership_state = 'unowned',
				eligibility_state = 'not_applicable', attempt_state = 'attempt_terminal', terminal_at_ms = $1,
				raw_fields = raw_fields || jsonb_build_object('last_failure_message', 'attempt_timeout')
				WHERE partition_key = $2 AND execution_id = $3`, now, p, k.id); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO ff_completion_event (partition_key, execution_id, flow_id, outcome,
				namespace, instance_tag, occurred_at_ms)
				SELECT partition_key, execution_id, flow_id, 'expired', NULL, NULL, $3 FROM ff_exec_core
				 WHERE partition_key = $1 AND execution_id = $2`, p, k.id, now); err != nil {
				return err
			}
		}
		_, err = tx.Exec(ctx, `INSERT INTO ff_lease_event (execution_id, lease_id, event_type, occurred_at_ms, partition_key, namespace, instance_tag)
			SELECT $2::text, NULL, 'expired', $3, $1::int, raw_fields->>'namespace', raw_fields->'tags'->>'cairn.instance_id'
			  FROM ff_exec_core WHERE partition_key = $1 AND execution_id = $2::uuid`, p, k.id, now)
		return err
	},
	setBased: func(ctx context.Context, db store.DB, p int16, now int64) error {
		_, err := db.Exec(ctx, `
			WITH att AS (
			    UPDATE ff_attempt a SET outcome = 'interrupted', lease_expires_at_ms = NULL, terminal_at_ms = $2
			      FROM ff_exec_core e
			     WHERE a.partition_key = $1 AND a.lease_expires_at_ms IS NOT NULL AND a.lease_expires_at_ms < $2
			       AND e.partition_key = $1 AND e.execution_id = a.execution_id AND e.lifecycle_phase = 'active'
			    RETURNING a.execution_id, e.attempt_index < COALESCE((e.policy->'retry_policy'->>'max_retries')::bigint, 0) AS retry
			), ec AS (
			    UPDATE ff_exec_core e
			       SET lifecycle_phase = CASE WHEN r.retry THEN 'runnable' ELSE 'terminal' END,
			           ownership_state = 'unowned',
			           eligibility_state = CASE WHEN r.retry THEN 'eligible_now' ELSE 'not_applicable' END,
			           attempt_state = CASE WHEN r.retry THEN 'pending_retry_attempt' ELSE 'attempt_terminal' END,
			           attempt_index = e.attempt_index + CASE WHEN r.retry THEN 1 ELSE 0 END,
			           terminal_at_ms = CASE WHEN r.retry THEN e.terminal_at_ms ELSE $2 END,
			           raw_fields = e.raw_fields || jsonb_build_object('last_failure_message', 'attempt_timeout')
			      FROM att r
			     WHERE e.partition_key = $1 AND e.execution_id = r.execution_id
			    RETURNING e.execution_id, e.flow_id, e.raw_fields, r.retry
			), ce AS (
			    INSERT INTO ff_completion_event (partition_key, execution_id, flow_id, outcome, occurred_at_ms)
			    SELECT $1, execution_id, flow_id, 'expired', $2 FROM ec WHERE NOT retry
			)
			INSERT INTO ff_lease_event (execution_id, event_type, occurred_at_ms, partition_key, namespace, instance_tag)
			SELECT execution_id::text, 'expired', $2, $1::int, raw_fields->>'namespace', raw_fields->'tags'->>'cairn.instance_id' FROM ec`, p, now)
		if err != nil {
			return fmt.Errorf("set-based attempt timeout in partition %d: %w", p, err)
		}
		return nil
	},
}

var attemptLateness = latenessRun{
	name:       "attempt timeout",
	reconciler: workers.AttemptTimeout.Name,
	configure:  withoutLeaseExpiry,
	feed: func(ctx context.Context, e *env, n int, deadlineMs int64) error {
		return seedAttempts(ctx, e, n, deadlineMs, false, map[string]any{"bench_deadline_ms": deadlineMs})
	},
	remaining: func(ctx context.Context, db store.DB) (int, error) {
		var n int
		err := db.QueryRow(ctx, `SELECT count(*) FROM ff_attempt WHERE lease_expires_at_ms IS NOT NULL`).Scan(&n)
		return n, err
	},
	// The lease event's occurred_at_ms is the action's clock, taken in the
	// statement that commits it.
	latencies: func(ctx context.Context, db store.DB) ([]float64, error) {
		return collectFloats(db.Query(ctx, `
			SELECT (ev.occurred_at_ms - (e.raw_fields->>'bench_deadline_ms')::bigint)::float8
			  FROM ff_lease_event ev
			  JOIN ff_exec_core e ON e.partition_key = ev.partition_key AND e.execution_id = ev.execution_id::uuid`))
	},
}
