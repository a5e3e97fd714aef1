package bench

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/workers"
)

// EnqueueResult is one run of the promote section: ad-hoc promotions
// enqueued one per transaction from Conns connections for a while, with no
// fleet running.
type EnqueueResult struct {
	Via        string // "ffreconcile_promote" or "Go client"
	At         string // "none" or how far ahead
	Conns      int
	Promotions int
	PerSec     float64
	// P50 and P99 are of one transaction: begin, the insert, commit.
	P50, P99 time.Duration
}

// promoteSQLCall is the one call another language makes.
const promoteSQLCall = `SELECT job_id FROM river.ffreconcile_promote($1::smallint, $2::uuid, $3::timestamptz)`

// promoteEnqueue measures enqueueing through the SQL function against the
// same through River's Go client (an insert-only client, InsertTx in the
// caller's transaction), without and with an "at" (an available job sends
// an insert notification; a scheduled one does not).
func (e *env) promoteEnqueue(ctx context.Context) ([]EnqueueResult, error) {
	var out []EnqueueResult
	for _, ahead := range []time.Duration{0, time.Hour} {
		for _, via := range []string{"ffreconcile_promote", "Go client"} {
			if err := e.reset(ctx); err != nil {
				return out, err
			}
			res, err := e.enqueueRun(ctx, via, ahead)
			if err != nil {
				return out, fmt.Errorf("promote via %s: %w", via, err)
			}
			e.progress("promote: via %s, at %s: %.0f/s from %d connections (transaction p50 %s, p99 %s)",
				res.Via, res.At, res.PerSec, res.Conns, res.P50, res.P99)
			out = append(out, res)
		}
	}
	return out, nil
}

func (e *env) enqueueRun(ctx context.Context, via string, ahead time.Duration) (EnqueueResult, error) {
	res := EnqueueResult{Via: via, At: "none", Conns: e.cfg.PromoteConns}
	if ahead > 0 {
		res.At = "+" + ahead.String()
	}
	insert := func(ctx context.Context, tx pgx.Tx, p int16, id string, at *time.Time) error {
		if via == "Go client" {
			_, err := e.inserter.InsertTx(ctx, tx, jobs.PromoteArgs{Partition: &p, ExecutionID: id, At: at}, nil)
			return err
		}
		var jobID int64
		return tx.QueryRow(ctx, promoteSQLCall, p, id, at).Scan(&jobID)
	}
	var (
		mu        sync.Mutex
		latencies []time.Duration
		firstErr  error
		wg        sync.WaitGroup
	)
	started := time.Now()
	stop := started.Add(e.cfg.PromoteFor)
	for range res.Conns {
		wg.Go(func() {
			var mine []time.Duration
			for time.Now().Before(stop) && ctx.Err() == nil {
				var at *time.Time
				if ahead > 0 {
					t := time.Now().Add(ahead).Truncate(time.Millisecond)
					at = &t
				}
				p, id := int16(len(mine)%256), uuid.NewString()
				t0 := time.Now()
				if err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error { return insert(ctx, tx, p, id, at) }); err != nil {
					mu.Lock()
					firstErr = cmpErr(firstErr, err)
					mu.Unlock()
					return
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			latencies = append(latencies, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(started)
	if firstErr != nil {
		return res, firstErr
	}
	var n int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM river.river_job WHERE kind = $1`, jobs.KindPromote).Scan(&n); err != nil {
		return res, err
	}
	if n != len(latencies) {
		return res, fmt.Errorf("%d promotions committed but %d jobs in river_job", len(latencies), n)
	}
	sort.Slice(latencies, func(i, j int) bool { return latencies[i] < latencies[j] })
	res.Promotions = len(latencies)
	res.PerSec = float64(res.Promotions) / elapsed.Seconds()
	if len(latencies) > 0 {
		res.P50 = latencies[len(latencies)/2].Round(10 * time.Microsecond)
		res.P99 = latencies[min(len(latencies)-1, len(latencies)*99/100)].Round(10 * time.Microsecond)
	}
	return res, nil
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// adhocSQLLateness is adhocLateness with the promotions enqueued through
// the SQL function, as a service in another language does: each feed's
// rows in one statement calling it once per row.
var adhocSQLLateness = latenessRun{
	name:       "ad-hoc promotion at delay-until via ffreconcile_promote (no sweep)",
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
		parts := make([]int16, len(rows))
		ids := make([]string, len(rows))
		for i, r := range rows {
			parts[i], ids[i] = r.Partition, r.ExecutionID
		}
		_, err = e.pool.Exec(ctx, `
			SELECT river.ffreconcile_promote(t.p, t.id, $3::timestamptz)
			  FROM unnest($1::smallint[], $2::uuid[]) AS t(p, id)`, parts, ids, time.UnixMilli(deadlineMs))
		return err
	},
	remaining: delayedRemaining,
	latencies: promotionLatencies,
}
