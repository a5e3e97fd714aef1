package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flowfabric/ffreconcile/internal/ffread"
	"github.com/flowfabric/ffreconcile/internal/ffseed"
	"github.com/flowfabric/ffreconcile/workers"
)

// BacklogResult is the backlog section: draining cancel backlogs whose
// grace has passed (FlowFabric's cancel_reconciler), by FlowFabric's loop
// as its Valkey scanner runs it and by ours.
type BacklogResult struct {
	Headers, Members int

	// FFTime is FlowFabric's statements one member after another on one
	// connection: per header its members, each cancelled by the operator
	// cancel (cancel_execution_once) and acked (ack_cancel_member), as its
	// Valkey scanner drains a backlog (it has no Postgres scanner).
	FFTime time.Duration
	FFCPU  CPUCost
	// OursTime is a fleet running cancel_backlog alone, from its start to
	// the last backlog row deleted.
	OursTime  time.Duration
	OursCPU   CPUCost
	OursStats string
}

// backlogTemplate is the database holding the seeded backlogs.
func (e *env) backlogTemplate() string { return e.cfg.DBName + "_backlog" }

// membersPerFlow is the size of each seeded backlog.
const membersPerFlow = 10

// seedBacklogs fills the bench database with n/membersPerFlow flows
// cancelled an hour ago whose server never acked their members: each flow
// (ff_flow_core, cancelled), its backlog header (requested an hour ago,
// grace_until_ms NULL, as FlowFabric's header leaves it) and
// membersPerFlow member rows (wire ids) of live executions of the flow.
func (e *env) seedBacklogs(ctx context.Context, n int) error {
	start := time.Now()
	requested := time.Now().Add(-time.Hour).UnixMilli()
	flows := n / membersPerFlow
	flow := func(g int) (int16, string) { return int16(g % 256), ffseed.MD5UUID("bflow" + strconv.Itoa(g)) }
	member := func(i int) (int16, string, string) {
		g, m := i/membersPerFlow+1, i%membersPerFlow+1
		p, f := flow(g)
		return p, f, ffseed.MD5UUID("bmember" + strconv.Itoa(g) + "-" + strconv.Itoa(m))
	}
	raw := json.RawMessage(`{"namespace": "bench", "cancellation_policy": "cancel_flow_only", "cancel_reason": "bench cancel"}`)
	err := errors.Join(
		ffseed.InsertSeries(ctx, e.pool, flows, func(i int) ffseed.FlowCore {
			p, f := flow(i + 1)
			return ffseed.FlowCore{Partition: p, FlowID: f, State: "cancelled", CreatedAtMs: requested - 60_000,
				TerminalAtMs: ffseed.Ms(requested), RawFields: raw}
		}),
		ffseed.InsertSeries(ctx, e.pool, flows, func(i int) ffseed.CancelBacklog {
			p, f := flow(i + 1)
			return ffseed.CancelBacklog{Partition: p, FlowID: f, RequestedAtMs: requested, Reason: "bench cancel",
				Policy: "cancel_flow_only"}
		}),
		ffseed.InsertSeries(ctx, e.pool, flows*membersPerFlow, func(i int) ffseed.Exec {
			p, f, id := member(i)
			return ffseed.Exec{Partition: p, ID: id, FlowID: f, LifecyclePhase: "runnable", OwnershipState: "unowned",
				EligibilityState: "eligible_now", PublicState: "waiting", AttemptState: "pending_first_attempt",
				CreatedAtMs: requested - 60_000, RawFields: benchRaw}
		}),
		ffseed.InsertSeries(ctx, e.pool, flows*membersPerFlow, func(i int) ffseed.CancelBacklogMember {
			p, f, id := member(i)
			return ffseed.CancelBacklogMember{Partition: p, FlowID: f, ExecutionID: ffseed.WireID(p, id)}
		}),
	)
	if err != nil {
		return fmt.Errorf("seed cancel backlogs: %w", err)
	}
	e.seeded("backlog", start)
	return e.settle(ctx, true)
}

// backlogLeft counts the backlog rows not yet drained.
func (e *env) backlogLeft(ctx context.Context) (int, error) {
	var n int
	err := e.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM ff_cancel_backlog_member) + (SELECT count(*) FROM ff_cancel_backlog)`).Scan(&n)
	return n, err
}

// checkDrained fails unless every backlog row is gone and every member
// ended cancelled by the operator cancel with its header's reason.
func (e *env) checkDrained(ctx context.Context, members int) error {
	left, err := e.backlogLeft(ctx)
	if err != nil {
		return err
	}
	var cancelled int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM ff_exec_core WHERE lifecycle_phase = 'cancelled'
		   AND public_state = 'cancelled' AND cancelled_by = 'operator_override' AND cancellation_reason = 'bench cancel'`).Scan(&cancelled); err != nil {
		return err
	}
	if left != 0 || cancelled != members {
		return fmt.Errorf("after the drain: %d backlog rows left (want 0), %d of %d members cancelled", left, cancelled, members)
	}
	return nil
}

// ffDrain is FlowFabric's drain on one connection: every header, oldest
// first, its members one after another, each cancelled and acked by
// FlowFabric's own statements (internal/ffread).
func ffDrain(ctx context.Context, conn *pgx.Conn) error {
	rows, err := conn.Query(ctx, `SELECT partition_key, flow_id::text, reason FROM ff_cancel_backlog ORDER BY requested_at_ms, partition_key, flow_id`)
	if err != nil {
		return err
	}
	type header struct {
		p            int16
		flow, reason string
	}
	headers, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (header, error) {
		var h header
		return h, r.Scan(&h.p, &h.flow, &h.reason)
	})
	if err != nil {
		return err
	}
	for _, h := range headers {
		rows, err := conn.Query(ctx, `SELECT execution_id FROM ff_cancel_backlog_member WHERE partition_key = $1 AND flow_id = $2 ORDER BY execution_id`, h.p, h.flow)
		if err != nil {
			return err
		}
		members, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		for _, m := range members {
			var id string
			if _, err := fmt.Sscanf(m, "{fp:%d}:%s", new(int), &id); err != nil {
				return fmt.Errorf("member %s: %w", m, err)
			}
			if _, err := ffread.CancelExecution(ctx, conn, h.p, id, ffread.CancelExecutionArgs{Reason: h.reason, Source: "operator_override"}); err != nil {
				return fmt.Errorf("cancel member %s: %w", m, err)
			}
			if err := ffread.AckCancelMember(ctx, conn, h.p, h.flow, m); err != nil {
				return fmt.Errorf("ack member %s: %w", m, err)
			}
		}
	}
	return nil
}

// backlog runs the section.
func (e *env) backlog(ctx context.Context) (BacklogResult, error) {
	n := e.cfg.BacklogMembers
	res := BacklogResult{Headers: n / membersPerFlow, Members: n / membersPerFlow * membersPerFlow}
	tmpl := e.backlogTemplate()
	if err := e.reset(ctx); err != nil {
		return res, err
	}
	e.progress("backlog: seeding %d cancel backlogs of %d members", res.Headers, membersPerFlow)
	if err := e.seedBacklogs(ctx, n); err != nil {
		return res, err
	}
	e.close()
	if err := adminExec(ctx, e.cfg.AdminURL, dropDatabase(tmpl),
		"CREATE DATABASE "+pgx.Identifier{tmpl}.Sanitize()+" TEMPLATE "+pgx.Identifier{e.cfg.DBName}.Sanitize()); err != nil {
		return res, err
	}
	defer func() { _ = adminExec(context.Background(), e.cfg.AdminURL, dropDatabase(tmpl)) }()

	// FlowFabric's drain, one member after another.
	if err := e.resetFrom(ctx, tmpl); err != nil {
		return res, err
	}
	conn, err := pgx.Connect(ctx, e.url)
	if err != nil {
		return res, err
	}
	cpu := sampleCPU()
	start := time.Now()
	err = ffDrain(ctx, conn)
	res.FFTime, res.FFCPU = time.Since(start), cpu.per(res.Members)
	conn.Close(ctx)
	if err != nil {
		return res, fmt.Errorf("FlowFabric's drain: %w", err)
	}
	if err := e.checkDrained(ctx, res.Members); err != nil {
		return res, fmt.Errorf("FlowFabric's drain: %w", err)
	}
	e.progress("backlog: FlowFabric's loop: %d members in %s (%.0f/s)", res.Members, res.FFTime.Round(time.Millisecond), float64(res.Members)/res.FFTime.Seconds())

	// Ours: cancel_backlog alone.
	if err := e.resetFrom(ctx, tmpl); err != nil {
		return res, err
	}
	cfg := e.fleetConfig()
	cfg.Reconcilers = map[string]time.Duration{workers.CancelBacklog.Name: time.Second}
	if res.OursTime, res.OursCPU, res.OursStats, err = e.drainWith(ctx, cfg, workers.CancelBacklog, res.Members, e.backlogLeft); err != nil {
		return res, err
	}
	if err := e.checkDrained(ctx, res.Members); err != nil {
		return res, fmt.Errorf("our drain: %w", err)
	}
	e.progress("backlog: ours: %d members in %s (%.0f/s); %s", res.Members, res.OursTime.Round(time.Millisecond),
		float64(res.Members)/res.OursTime.Seconds(), res.OursStats)
	return res, nil
}
