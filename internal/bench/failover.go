package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flowfabric/ffreconcile/workers"
)

// FailoverResult is the lease-expiry lateness stream run across a SIGKILL of
// the leader of a fleet of real `worker run` processes.
type FailoverResult struct {
	// Takeover: the fleet took over from the dead leader (the default);
	// otherwise it ran with --no-takeover, leaving it to River.
	Takeover bool
	Lead     time.Duration
	// Processes is the fleet's size before the kill.
	Processes int
	Rows      int
	// All rows, and those due from the kill to the stream's end.
	P50, P99, Max                time.Duration
	AfterRows                    int
	AfterP50, AfterP99, AfterMax time.Duration
	// After the kill: the new leader's election, the first tick it ran, and
	// the end of the last job the killed process had left running (run
	// again by another process once taken over or rescued).
	Elected, FirstTick, LastOfKilled time.Duration
	// KilledJobs is how many jobs the killed process left running.
	KilledJobs        int
	Killed, NewLeader string
	// ElectedBeforeExpiry: the new leader was elected before the dead
	// leader's term would have expired (River alone waits for it).
	ElectedBeforeExpiry bool
	// Kill is how and when the leader went.
	Kill Kill
}

// Kill is how and when the failover section ends its fleet's leader.
type Kill int

const (
	// KillAThirdIn: SIGKILL a third into the stream, whatever the leader
	// is doing (often between two bursts, holding no job).
	KillAThirdIn Kill = iota
	// KillBusy: SIGKILL at the first moment, a third into the stream or
	// later (within 5 s), when the leader runs release jobs.
	KillBusy
	// StopAThirdIn: SIGTERM a third into the stream: a clean stop, which
	// finishes the running jobs and resigns the leadership.
	StopAThirdIn
)

func (k Kill) String() string {
	switch k {
	case KillBusy:
		return "SIGKILL, running row jobs"
	case StopAThirdIn:
		return "SIGTERM, a third in"
	default:
		return "SIGKILL, a third in"
	}
}

// failoverProcesses is the fleet's size: the leader and two survivors.
const failoverProcesses = 3

// failover runs the stream with each lead, once with the takeover and the
// handoff and once without (River's leadership TTL, rescuer and new
// leader's periodic start alone), ending the leader each way of Kill: a
// SIGKILL a third in, again at a moment it runs row jobs (a kill at a
// random moment often finds it between bursts, holding no job), and a
// clean stop.
func (e *env) failover(ctx context.Context) ([]FailoverResult, error) {
	if e.cfg.WorkerBinary == "" {
		return nil, errors.New("failover needs the worker binary (run it as `worker bench`)")
	}
	var out []FailoverResult
	for _, kill := range []Kill{KillAThirdIn, KillBusy, StopAThirdIn} {
		for _, takeover := range []bool{true, false} {
			for _, lead := range e.cfg.LatenessLeads {
				res, err := e.failoverRun(ctx, takeover, lead, kill)
				if err != nil {
					return out, fmt.Errorf("failover (takeover %v, lead %s, %s): %w", takeover, lead, kill, err)
				}
				out = append(out, res)
			}
		}
	}
	return out, nil
}

// runArgs are the `worker run` flags of a process configured as the
// benchmark's own fleet (e.cfg.Fleet), every reconciler but attempt timeout
// on, as in the lease lateness stream.
func (e *env) runArgs(clientID string, takeover bool) []string {
	fc := e.cfg.Fleet
	var names []string
	for _, r := range workers.DefaultOn(nil) {
		if r != workers.AttemptTimeout {
			names = append(names, r.Name)
		}
	}
	args := []string{"run", "--database-url", e.url, "--http-addr", "", "--client-id", clientID,
		"--reconcilers", strings.Join(names, ",")}
	add := func(flag string, v int) {
		if v != 0 {
			args = append(args, "--"+flag, strconv.Itoa(v))
		}
	}
	add("row-workers", fc.RowWorkers)
	add("work-conns", fc.WorkConns)
	// fleet.Config's -1 (none) is the command line's 0.
	if fc.DispatchLanes != 0 {
		args = append(args, "--dispatch-lanes", strconv.Itoa(max(fc.DispatchLanes, 0)))
	}
	add("row-batch", fc.RowBatch)
	add("row-statements", fc.RowStatements)
	if fc.RowFetchCooldown != 0 {
		args = append(args, "--row-fetch-cooldown", fc.RowFetchCooldown.String())
	}
	// fleet.Config's negative lookahead (off) is the command line's 0.
	if fc.Lookahead != 0 {
		args = append(args, "--lookahead", max(fc.Lookahead, 0).String())
	}
	if fc.DisableJobLogs {
		args = append(args, "--no-job-logs")
	}
	if !takeover {
		args = append(args, "--no-takeover")
	}
	return args
}

// child is one `worker run` process of the failover fleet.
type child struct {
	id   string
	cmd  *exec.Cmd
	log  string
	done chan struct{} // closed once the process has exited and been waited for
}

// exited reports whether the process has exited.
func (k *child) exited() bool {
	select {
	case <-k.done:
		return true
	default:
		return false
	}
}

func (e *env) failoverRun(ctx context.Context, takeover bool, lead time.Duration, kill Kill) (FailoverResult, error) {
	res := FailoverResult{Takeover: takeover, Lead: lead, Processes: failoverProcesses, Kill: kill}
	if err := e.reset(ctx); err != nil {
		return res, err
	}
	dir, err := os.MkdirTemp("", "ffbench-failover-")
	if err != nil {
		return res, err
	}
	var kids []*child
	defer func() {
		for _, k := range kids {
			if !k.exited() {
				_ = k.cmd.Process.Signal(syscall.SIGTERM)
			}
			<-k.done
		}
		os.RemoveAll(dir)
	}()
	logTail := func() string {
		var b strings.Builder
		for _, k := range kids {
			data, _ := os.ReadFile(k.log)
			lines := strings.Split(strings.TrimSpace(string(data)), "\n")
			fmt.Fprintf(&b, "\n%s:\n%s", k.id, strings.Join(lines[max(0, len(lines)-5):], "\n"))
		}
		return b.String()
	}
	for i := range failoverProcesses {
		k := &child{id: fmt.Sprintf("failover-%d", i+1), log: filepath.Join(dir, fmt.Sprintf("failover-%d.log", i+1)), done: make(chan struct{})}
		f, err := os.Create(k.log)
		if err != nil {
			return res, err
		}
		k.cmd = exec.Command(e.cfg.WorkerBinary, e.runArgs(k.id, takeover)...)
		k.cmd.Stdout, k.cmd.Stderr = f, f
		k.cmd.Env = childEnv()
		err = k.cmd.Start()
		f.Close()
		if err != nil {
			return res, fmt.Errorf("start %s: %w", k.id, err)
		}
		go func() { _ = k.cmd.Wait(); close(k.done) }()
		kids = append(kids, k)
	}
	byID := func(id string) *child {
		for _, k := range kids {
			if k.id == id {
				return k
			}
		}
		return nil
	}

	// The stream starts once a leader ticked lease expiry and every process
	// has worked a job: the first ticks and fetches plan over 256
	// partitions, which is start-up, not steady state.
	started := time.Now()
	for {
		var ticks, workers int
		err := e.pool.QueryRow(ctx, `
			SELECT count(*) FILTER (WHERE kind = 'ff.lease_expiry.tick' AND state = 'completed'),
			       (SELECT count(DISTINCT by) FROM river.river_job, unnest(attempted_by) AS by)
			  FROM river.river_job`).Scan(&ticks, &workers)
		if err != nil {
			return res, err
		}
		if ticks >= 2 && workers == failoverProcesses {
			break
		}
		if time.Since(started) > 2*time.Minute {
			return res, fmt.Errorf("fleet not ready after 2 minutes (%d lease ticks, %d processes worked jobs):%s", ticks, workers, logTail())
		}
		time.Sleep(200 * time.Millisecond)
	}
	e.progress("failover (takeover %v, lead %s, %s): %d processes ready after %s; %d rows/s for %s",
		takeover, lead, kill, failoverProcesses, time.Since(started).Round(time.Millisecond), e.cfg.LatenessRate, e.cfg.LatenessFor)

	perFeed := max(1, e.cfg.LatenessRate*int(feedEvery/time.Millisecond)/1000)
	tick := time.NewTicker(feedEvery)
	defer tick.Stop()
	streamStart := time.Now()
	stop := streamStart.Add(e.cfg.LatenessFor)
	killAt := streamStart.Add(e.cfg.LatenessFor / 3)
	var killedAt time.Time
	var oldExpires time.Time
	for time.Now().Before(stop) {
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-tick.C:
		}
		if killedAt.IsZero() && time.Now().After(killAt) {
			killed, err := e.killLeader(ctx, byID, kill, time.Since(killAt) < 5*time.Second, &res, &oldExpires)
			if err != nil {
				return res, err
			}
			killedAt = killed
		}
		deadline := time.Now().Add(lead).UnixMilli()
		if err := leaseLateness.feed(ctx, e, perFeed, deadline); err != nil {
			return res, fmt.Errorf("feed: %w", err)
		}
		res.Rows += perFeed
	}
	if _, err := waitDrained(ctx, 3*time.Minute, func(ctx context.Context) (int, error) { return leaseLateness.remaining(ctx, e.pool) }); err != nil {
		return res, fmt.Errorf("%w:%s", err, logTail())
	}

	// What the fleet did after the kill, by the database's clock.
	var newLeader *string
	var elected, firstTick, lastOfKilled *time.Time
	err = e.pool.QueryRow(ctx, `
		SELECT (SELECT leader_id FROM river.river_leader),
		       (SELECT elected_at FROM river.river_leader),
		       (SELECT min(attempted_at) FROM river.river_job WHERE kind LIKE 'ff.%.tick' AND created_at > $1),
		       max(finalized_at), count(*)
		  FROM river.river_job
		 WHERE $2 = ANY(attempted_by) AND attempted_by[cardinality(attempted_by)] <> $2`,
		killedAt, res.Killed).Scan(&newLeader, &elected, &firstTick, &lastOfKilled, &res.KilledJobs)
	if err != nil {
		return res, err
	}
	since := func(t *time.Time) time.Duration {
		if t == nil {
			return 0
		}
		return t.Sub(killedAt)
	}
	if newLeader != nil {
		res.NewLeader = *newLeader
	}
	res.Elected, res.FirstTick, res.LastOfKilled = since(elected), since(firstTick), since(lastOfKilled)
	res.ElectedBeforeExpiry = elected != nil && elected.Before(oldExpires)

	rows, err := e.pool.Query(ctx, `
		SELECT (e.raw_fields->>'bench_deadline_ms')::bigint, ev.occurred_at_ms
		  FROM ff_lease_event ev
		  JOIN ff_exec_core e ON e.partition_key = ev.partition_key AND e.execution_id = ev.execution_id::uuid
		 WHERE ev.event_type = 'expired' AND e.raw_fields ? 'bench_deadline_ms'`)
	if err != nil {
		return res, err
	}
	var all, after []float64
	var deadlineMs, actedMs int64
	_, err = pgx.ForEachRow(rows, []any{&deadlineMs, &actedMs}, func() error {
		late := float64(actedMs - deadlineMs)
		all = append(all, late)
		if deadlineMs >= killedAt.UnixMilli() {
			after = append(after, late)
		}
		return nil
	})
	if err != nil {
		return res, err
	}
	if len(all) != res.Rows {
		return res, fmt.Errorf("measured %d rows of %d fed (a lease expired twice or never)", len(all), res.Rows)
	}
	res.P50, res.P99, res.Max = quantiles(all)
	res.AfterRows = len(after)
	res.AfterP50, res.AfterP99, res.AfterMax = quantiles(after)
	e.progress("failover (takeover %v, lead %s, %s): ended %s; new leader %s elected %s after, first tick %s after; the %d jobs it left running done %s after; "+
		"lateness p50 %s p99 %s max %s over %d rows, of rows due after the kill p50 %s p99 %s max %s over %d",
		takeover, lead, kill, res.Killed, res.NewLeader, res.Elected.Round(time.Millisecond), res.FirstTick.Round(time.Millisecond),
		res.KilledJobs, res.LastOfKilled.Round(time.Millisecond), res.P50, res.P99, res.Max, res.Rows, res.AfterP50, res.AfterP99, res.AfterMax, res.AfterRows)
	return res, nil
}

// killLeader ends the fleet's leader as kill says and returns when,
// recording it in res and the end of its term in expires; for KillBusy
// while waitBusy, only if it runs release jobs (zero time otherwise: not
// killed yet). A stopped leader is waited for: its clean stop finishes its
// running jobs, then resigns.
func (e *env) killLeader(ctx context.Context, byID func(string) *child, kill Kill, waitBusy bool, res *FailoverResult, expires *time.Time) (time.Time, error) {
	var leader string
	var running int
	if err := e.pool.QueryRow(ctx, `
		SELECT l.leader_id, l.expires_at,
		       (SELECT count(*) FROM river.river_job
		         WHERE state = 'running' AND kind = 'ff.lease_expiry.release'
		           AND attempted_by[cardinality(attempted_by)] = l.leader_id)
		  FROM river.river_leader l`).Scan(&leader, expires, &running); err != nil {
		return time.Time{}, fmt.Errorf("read the leader: %w", err)
	}
	if kill == KillBusy && waitBusy && running == 0 {
		return time.Time{}, nil
	}
	k := byID(leader)
	if k == nil {
		return time.Time{}, fmt.Errorf("leader %q is none of the fleet's processes", leader)
	}
	sig := syscall.SIGKILL
	if kill == StopAThirdIn {
		sig = syscall.SIGTERM
	}
	if err := k.cmd.Process.Signal(sig); err != nil {
		return time.Time{}, fmt.Errorf("%s %s: %w", sig, leader, err)
	}
	at := time.Now()
	if sig == syscall.SIGKILL {
		<-k.done
	}
	// A stopping leader is not waited for: the stream goes on meanwhile.
	res.Killed = leader
	return at, nil
}

// quantiles returns p50, p99 and the max of ms, in milliseconds.
func quantiles(ms []float64) (p50, p99, maxD time.Duration) {
	if len(ms) == 0 {
		return 0, 0, 0
	}
	sort.Float64s(ms)
	q := func(p float64) time.Duration {
		return time.Duration(ms[min(len(ms)-1, int(p*float64(len(ms))))] * float64(time.Millisecond))
	}
	return q(0.5), q(0.99), time.Duration(ms[len(ms)-1] * float64(time.Millisecond))
}

// childEnv is the benchmark's environment without settings that would make
// a child process differ from the flags it is given.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "FF_") || name == "DATABASE_URL" {
			continue
		}
		env = append(env, kv)
	}
	return env
}
