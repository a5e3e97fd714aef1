package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/flowfabric/ffreconcile/internal/ffseed"
	"github.com/flowfabric/ffreconcile/workers"
)

// FlowsResult is the flows section: the flow summary's projection rate
// over a backfill of finished flows, and what those flows cost an idle
// fleet once projected.
type FlowsResult struct {
	Flows   int // finished flows, three members each
	Members int

	// ProjectTime is a fleet running flow_summary alone, from its start to
	// the last flow's summary written (its first pass: every member ended
	// before any mark, the backfill of a fleet started on an existing
	// database).
	ProjectTime time.Duration
	ProjectCPU  CPUCost
	Stats       string

	// IdleEmpty and IdleFinished are the default fleet idle on an empty
	// database and on the one holding the projected flows: the projector
	// never reads a finished flow again, so they should be alike.
	IdleEmpty, IdleFinished IdleCost
}

// seedFinishedFlows fills the bench database with n flows of FlowFabric's
// layout (ff_flow_core), each with three members that ended an hour ago:
// two completed, one failed on every tenth flow.
func (e *env) seedFinishedFlows(ctx context.Context, n int) error {
	start := time.Now()
	ended := time.Now().Add(-time.Hour).UnixMilli()
	err := errors.Join(
		ffseed.InsertSeries(ctx, e.pool, n, func(i int) ffseed.FlowCore {
			return ffseed.FlowCore{Partition: int16((i + 1) % 256), FlowID: ffseed.MD5UUID("flow" + strconv.Itoa(i+1)),
				CreatedAtMs: ended - 60_000, RawFields: benchRaw}
		}),
		ffseed.InsertSeries(ctx, e.pool, 3*n, func(i int) ffseed.Exec {
			g, m := i/3+1, i%3+1
			public := "completed"
			if m == 3 && g%10 == 0 {
				public = "failed"
			}
			return ffseed.Exec{Partition: int16(g % 256), ID: ffseed.MD5UUID("member" + strconv.Itoa(g) + "-" + strconv.Itoa(m)),
				FlowID: ffseed.MD5UUID("flow" + strconv.Itoa(g)), LifecyclePhase: "terminal", OwnershipState: "unowned",
				EligibilityState: "not_applicable", PublicState: public, AttemptState: "attempt_terminal",
				CreatedAtMs: ended - 60_000, TerminalAtMs: ffseed.Ms(ended + int64(m)), RawFields: benchRaw}
		}),
	)
	if err != nil {
		return fmt.Errorf("seed finished flows: %w", err)
	}
	e.seeded("flows", start)
	return e.settle(ctx, true)
}

func (e *env) flows(ctx context.Context) (FlowsResult, error) {
	n := e.cfg.FinishedFlows
	res := FlowsResult{Flows: n, Members: 3 * n}

	if err := e.reset(ctx); err != nil {
		return res, err
	}
	e.progress("flows: default fleet idle on an empty database for %s", e.cfg.IdleFor)
	var err error
	if res.IdleEmpty, err = e.idleOurs(ctx, e.fleetConfig()); err != nil {
		return res, fmt.Errorf("idle, no flows: %w", err)
	}

	e.progress("flows: seeding %d finished flows (%d members)", n, 3*n)
	if err := e.seedFinishedFlows(ctx, n); err != nil {
		return res, err
	}
	e.progress("flows: flow_summary alone projecting them")
	fc := e.fleetConfig()
	fc.Reconcilers = map[string]time.Duration{workers.FlowSummary.Name: workers.FlowSummary.Interval}
	res.ProjectTime, res.ProjectCPU, res.Stats, err = e.drainWith(ctx, fc, workers.FlowSummary, n, func(ctx context.Context) (int, error) {
		var left int
		err := e.pool.QueryRow(ctx, `SELECT $1::int - count(*) FROM ff_flow_summary`, n).Scan(&left)
		return left, err
	})
	if err != nil {
		return res, fmt.Errorf("projecting %d flows: %w", n, err)
	}
	var wrong int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM ff_flow_summary
		 WHERE total_members <> 3 OR members_completed + members_failed <> 3
		    OR public_flow_state <> CASE WHEN members_failed > 0 THEN 'failed' ELSE 'completed' END`).Scan(&wrong); err != nil {
		return res, err
	}
	if wrong != 0 {
		return res, fmt.Errorf("%d of %d flow summaries do not say what their members are", wrong, n)
	}
	e.progress("flows: %d flows projected in %s (%.0f/s)", n, res.ProjectTime.Round(time.Millisecond), float64(n)/res.ProjectTime.Seconds())

	e.progress("flows: default fleet idle beside %d finished flows for %s", n, e.cfg.IdleFor)
	if res.IdleFinished, err = e.idleOurs(ctx, e.fleetConfig()); err != nil {
		return res, fmt.Errorf("idle, %d finished flows: %w", n, err)
	}
	e.progress("flows: idle %.1f stmt/s empty, %.1f stmt/s beside %d finished flows",
		res.IdleEmpty.StatementsPerSec, res.IdleFinished.StatementsPerSec, n)
	return res, nil
}
