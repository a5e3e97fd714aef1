package metrics_test

import (
	"encoding/json"
	"io"
	"net/http/httptest"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/internal/fleettest"
	"github.com/flowfabric/ffreconcile/internal/metrics"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

func scrape(t *testing.T, m *metrics.Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	return string(body)
}

// value returns the value of the sample whose name and labels match.
func value(t *testing.T, body, sample string) float64 {
	t.Helper()
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(sample) + ` ([0-9.e+-]+)$`)
	m := re.FindStringSubmatch(body)
	if m == nil {
		return -1
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestMetricsFollowTheWork: the counters, histograms and gauges follow a
// fleet releasing expired leases; before it runs, the stall shows as the
// age of the oldest due row (a regression: a gauge that stays 0, or drops
// out, while nothing acts), and every series a dashboard or an alert reads
// is there from the start with zeros (a regression: a panel or an alert
// with no series until something happens).
func TestMetricsFollowTheWork(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	now := store.NowMs()
	const n = 5
	for i := range n {
		id := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: int16(i)})
		fftest.InsertAttempt(t, db.Pool, int16(i), id, 0, fftest.Ms(now-2000))
	}

	// Before any worker runs: the gauge sees the due rows.
	idle := metrics.New(metrics.Config{Stats: workers.NewStats(), Pool: db.Pool, RiverSchema: testdb.RiverSchema, ReadTimeout: slowRead})
	body := scrape(t, idle)
	if v := value(t, body, `ffreconcile_due_rows{reconciler="lease_expiry"}`); v != n {
		t.Fatalf("due_rows before work = %v; want %d\n%s", v, n, body)
	}
	if v := value(t, body, `ffreconcile_actions_applied_total{reconciler="lease_expiry"}`); v != 0 {
		t.Fatalf("actions_applied before work = %v; want 0", v)
	}
	if v := value(t, body, `ffreconcile_database_up`); v != 1 {
		t.Fatalf("database_up = %v", v)
	}
	// Nothing acts: the leases' deadline, 2 s ago, is the stall's age (for
	// lease_expiry, and attempt_timeout, whose rows they are too).
	if v := value(t, body, `ffreconcile_oldest_due_seconds{reconciler="lease_expiry"}`); v < 2 {
		t.Fatalf("oldest_due_seconds of leases 2 s overdue = %v; want at least 2\n%s", v, body)
	}
	for _, r := range workers.All() {
		// Every reconciler with due rows (not one whose periodic job acts
		// by itself, which has none), 0 when nothing is due (retention:
		// off here).
		oldest := value(t, body, `ffreconcile_oldest_due_seconds{reconciler="`+r.Name+`"}`)
		switch due := value(t, body, `ffreconcile_due_rows{reconciler="`+r.Name+`"}`); {
		case !r.HasDue():
			if due != -1 || oldest != -1 {
				t.Errorf("%s exports due rows (%v) or their age (%v) though it has none", r.Name, due, oldest)
			}
		case due > 0 && oldest < 2:
			t.Errorf("oldest_due_seconds{%s} = %v with %v rows 2 s overdue; want at least 2", r.Name, oldest, due)
		case due <= 0 && oldest != 0:
			t.Errorf("oldest_due_seconds{%s} = %v with nothing due; want 0", r.Name, oldest)
		}
		// Lateness for every reconciler with a deadline, none for the
		// cancel pair, whose groups have none.
		lateness := value(t, body, `ffreconcile_lateness_seconds_count{reconciler="`+r.Name+`"}`)
		if want := 0.0; r.HasDue() && r.Due.Always {
			if lateness != -1 {
				t.Errorf("%s exports a lateness (%v) though its rows have no deadline", r.Name, lateness)
			}
		} else if lateness != want {
			t.Errorf("lateness_seconds_count{%s} = %v; want %v before any action", r.Name, lateness, want)
		}
		for _, why := range r.NoOpReasons {
			if v := value(t, body, `ffreconcile_actions_noop_total{reason="`+why.String()+`",reconciler="`+r.Name+`"}`); v != 0 {
				t.Errorf("actions_noop_total{%s, %s} = %v; want 0 before any action", r.Name, why, v)
			}
		}
	}
	zeros := []string{
		`ffreconcile_river_jobs{kind="ff.lease_expiry.release",reconciler="lease_expiry",state="discarded"}`,
		`ffreconcile_river_jobs{kind="ff.cancel_dispatch.tick",reconciler="cancel_dispatch",state="available"}`,
		`ffreconcile_river_jobs{kind="ff.outbox_retention.trim",reconciler="outbox_retention",state="retryable"}`,
		`ffreconcile_actions_noop_total{reason="flag_clear",reconciler="cancel_dispatch"}`,
	}
	for _, sample := range zeros {
		if v := value(t, body, sample); v != 0 {
			t.Errorf("%s = %v; want 0 before any job", sample, v)
		}
	}
	if v := value(t, body, `ffreconcile_leader`); v != -1 {
		t.Errorf("leader = %v without a River client; want no gauge", v)
	}
	if !regexp.MustCompile(`(?m)^ffreconcile_build_info\{goversion="go[^"]+",revision="[^"]*",version="[^"]+"\} 1$`).MatchString(body) {
		t.Errorf("no build_info with its labels:\n%s", body)
	}

	f := fleettest.Start(t, db, fleet.Config{Reconcilers: fleettest.Fast(workers.LeaseExpiry), MetricsReadTimeout: slowRead})
	fleettest.WaitFor(t, fleettest.Patient, "leases released", func() (bool, string) {
		left := fftest.Count(t, db.Pool, `SELECT count(*) FROM ff_attempt WHERE lease_expires_at_ms IS NOT NULL`)
		return left == 0, fleettest.Statusf("%d left", left)
	})
	fleettest.WaitFor(t, fleettest.Patient, "release jobs completed", func() (bool, string) {
		c := fftest.Count(t, db.Pool, `SELECT count(*) FROM river.river_job WHERE kind = $1 AND state = 'completed'`, jobs.KindLeaseRelease)
		return c == n, fleettest.Statusf("%d completed", c)
	})

	body = scrape(t, f.Metrics)
	checks := map[string]float64{
		`ffreconcile_actions_applied_total{reconciler="lease_expiry"}`:                                       n,
		`ffreconcile_row_jobs_enqueued_total{reconciler="lease_expiry"}`:                                     n,
		`ffreconcile_errors_total{reconciler="lease_expiry"}`:                                                0,
		`ffreconcile_lateness_seconds_count{reconciler="lease_expiry"}`:                                      n,
		`ffreconcile_due_rows{reconciler="lease_expiry"}`:                                                    0,
		`ffreconcile_river_jobs{kind="ff.lease_expiry.release",reconciler="lease_expiry",state="completed"}`: n,
		`ffreconcile_job_duration_seconds_count{reconciler="lease_expiry",step="row"}`:                       n,
	}
	for sample, want := range checks {
		if got := value(t, body, sample); got != want {
			t.Errorf("%s = %v; want %v", sample, got, want)
		}
	}
	// A row is read again by each scan that runs before its job has
	// released it (a slow job, or a tick a moment early), so examined rows
	// are at least the rows, not exactly them; the unique row job keeps
	// the enqueued count exact.
	if got := value(t, body, `ffreconcile_rows_examined_total{reconciler="lease_expiry"}`); got < n {
		t.Errorf("rows_examined_total = %v; want at least %v", got, n)
	}
	after := map[string]float64{
		`ffreconcile_oldest_due_seconds{reconciler="lease_expiry"}`:                        0,
		`ffreconcile_actions_noop_total{reason="no_longer_due",reconciler="lease_expiry"}`: 0,
		`ffreconcile_leader`: 1,
		`ffreconcile_tick_interval_seconds{reconciler="lease_expiry"}`:                                       1,
		`ffreconcile_pool_connections_max{pool="work"}`:                                                      float64(f.Config.WorkConns),
		`ffreconcile_pool_connections_max{pool="tick"}`:                                                      2,
		`ffreconcile_river_jobs{kind="ff.lease_expiry.release",reconciler="lease_expiry",state="discarded"}`: 0,
	}
	for sample, want := range after {
		if got := value(t, body, sample); got != want {
			t.Errorf("%s = %v; want %v", sample, got, want)
		}
	}
	// Reconcilers this process does not run have no interval: the stall
	// alert leaves them alone.
	if v := value(t, body, `ffreconcile_tick_interval_seconds{reconciler="retention"}`); v != -1 {
		t.Errorf("tick_interval_seconds of retention, not run = %v; want none", v)
	}
	for _, pool := range []string{"river", "work", "tick"} {
		if v := value(t, body, `ffreconcile_pool_acquires_total{pool="`+pool+`"}`); v < 1 {
			t.Errorf("pool_acquires_total{%s} = %v; want the fleet's acquires", pool, v)
		}
	}
	if v := value(t, body, `ffreconcile_tick_duration_seconds_count{reconciler="lease_expiry"}`); v < 1 {
		t.Errorf("tick_duration count = %v; want at least one tick", v)
	}
	// Lateness is at least the 2 s the leases were overdue when seeded.
	if v := value(t, body, `ffreconcile_lateness_seconds_bucket{reconciler="lease_expiry",le="1"}`); v != 0 {
		t.Errorf("%v actions reported lateness under 1 s for leases 2 s overdue", v)
	}
	if !strings.Contains(body, "# HELP ffreconcile_actions_noop_total") {
		t.Error("no-op counter undocumented")
	}
	checkDashboard(t, body)

	// Each release job keeps its own log line for River UI.
	var logged int
	if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM river.river_job WHERE kind = $1
		AND metadata->'river:log'->0->>'log' LIKE '%released expired lease%'`, jobs.KindLeaseRelease).Scan(&logged); err != nil {
		t.Fatal(err)
	}
	if logged != n {
		t.Fatalf("%d release jobs carry a job log line; want %d", logged, n)
	}
	// All the same line: one naming its row, or with a time, costs
	// River's GIN index over metadata an entry per job (see the fleet's job
	// log).
	var lines []string
	rows, err := db.Pool.Query(t.Context(), `SELECT DISTINCT metadata->'river:log'->0->>'log' FROM river.river_job WHERE kind = $1`, jobs.KindLeaseRelease)
	if err != nil {
		t.Fatal(err)
	}
	if lines, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if len(lines) != 1 {
		t.Errorf("%d release jobs of one outcome log %d distinct lines; want one: %q", n, len(lines), lines)
	}
}

// checkDashboard fails when the Grafana dashboard (docs/grafana) or the
// alert rules (docs/prometheus/alerts.yml) name a metric /metrics does not
// export, after a fleet has done some work (so the histograms have
// samples): a renamed metric would leave a panel empty, or an alert
// silent, without anyone noticing. It fails too when README's metrics
// table and /metrics disagree (a metric a reader never learns of, or a row
// for one that is gone). The dashboard's rates use Grafana's
// $__rate_interval: a fixed window shorter than four scrape intervals
// draws nothing.
func checkDashboard(t *testing.T, body string) {
	t.Helper()
	raw, err := os.ReadFile("../../docs/grafana/ffreconcile.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	names := regexp.MustCompile(`\bffreconcile_[a-z_]+`)
	exported := func(name string) bool { return regexp.MustCompile(`(?m)^` + name + `[{ ]`).MatchString(body) }
	fixedWindow := regexp.MustCompile(`\[[0-9]+[smhd]\]`)
	seen := 0
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, target := range p.Targets {
			for _, name := range names.FindAllString(target.Expr, -1) {
				seen++
				if !exported(name) {
					t.Errorf("panel %q queries %s, which /metrics does not export", p.Title, name)
				}
			}
			if w := fixedWindow.FindString(target.Expr); w != "" {
				t.Errorf("panel %q uses the fixed window %s; want [$__rate_interval]: %s", p.Title, w, target.Expr)
			}
		}
	}
	if seen < 20 {
		t.Errorf("the dashboard names only %d metrics; the check read too little", seen)
	}
	rules, err := os.ReadFile("../../docs/prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	inRules := names.FindAllString(string(rules), -1)
	for _, name := range inRules {
		if !exported(name) {
			t.Errorf("docs/prometheus/alerts.yml names %s, which /metrics does not export", name)
		}
	}
	if len(inRules) < 6 {
		t.Errorf("the alert rules name only %d metrics; the check read too little", len(inRules))
	}

	// README's metrics table names every family /metrics exports, and
	// only those.
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(string(readme), "| metric | type | meaning |")
	if i < 0 {
		t.Fatal("README has no metrics table")
	}
	table := string(readme)[i:]
	table = table[:strings.Index(table, "\n\n")]
	// Exported only in fleets other than this test's, as their rows say.
	conditional := map[string]bool{
		"ffreconcile_due_rows_outside_filter": true, // with a tenant filter
		"ffreconcile_cancel_backlog_depth":    true, // running cancel_backlog (a Reconciler.Gauges)
	}
	inReadme := map[string]bool{}
	for _, name := range names.FindAllString(table, -1) {
		inReadme[name] = true
		if !conditional[name] && !regexp.MustCompile(`(?m)^# TYPE `+name+` `).MatchString(body) {
			t.Errorf("README's metrics table lists %s, which /metrics does not export", name)
		}
	}
	families := regexp.MustCompile(`(?m)^# TYPE (ffreconcile_[a-z_]+) `).FindAllStringSubmatch(body, -1)
	for _, m := range families {
		if !inReadme[m[1]] {
			t.Errorf("/metrics exports %s, which README's metrics table does not list", m[1])
		}
	}
	if len(families) < 30 {
		t.Errorf("/metrics exports only %d families; the check read too little", len(families))
	}
}

// slowRead is the read timeout of tests that check values rather than
// timeouts: a count over 256 partitions in the parallel suite on 2 cores
// has taken more than the default 3 s.
const slowRead = 30 * time.Second

// TestScrapeServesLastValuesWhileReading: once the first scrape has read
// the database, a scrape never waits for it: it serves the last values and
// starts a new read, whose result a later scrape serves. A regression makes
// a scrape wait for a slow database until the read's statement_timeout
// (3 s), past a short scrape's timeout, and then report database_up 0:
// Prometheus would show the process down when only the database is slow.
func TestScrapeServesLastValuesWhileReading(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := testdb.New(t)
	m := metrics.New(metrics.Config{Stats: workers.NewStats(), Pool: db.Pool, RiverSchema: testdb.RiverSchema, CacheFor: time.Nanosecond})
	up := func() float64 { return value(t, scrape(t, m), `ffreconcile_database_up`) }
	if v := up(); v != 1 {
		t.Fatalf("database_up = %v at the first scrape; want 1", v)
	}

	// Hold river_job: the next read's count of River's jobs waits for the
	// lock until its statement timeout.
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := tx.Exec(ctx, `LOCK TABLE river.river_job IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	if v := up(); v != 1 {
		t.Fatalf("database_up = %v while a read waits for a lock; want the last read's 1, served at once", v)
	}
	fleettest.WaitFor(t, fleettest.Patient, "the blocked read reported", func() (bool, string) {
		v := up()
		return v == 0, fleettest.Statusf("database_up %v", v)
	})
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	fleettest.WaitFor(t, fleettest.Patient, "a read after the lock reported", func() (bool, string) {
		v := up()
		return v == 1, fleettest.Statusf("database_up %v", v)
	})
}

// TestDueGaugesCountSharedRowsOnce: the due-rows and oldest-due gauges count
// an expired lease for the reconciler that takes it in this fleet (Intervals
// names the reconcilers it runs): with lease expiry and attempt timeout both
// running, the leases of active executions declaring retries are attempt
// timeout's and the others lease expiry's, so the two gauges add up to the
// expired leases; a fleet running lease expiry alone counts every one for
// it. The dispatcher's gauge counts only the pending cancel groups it acts
// on. A regression counts a lease for both (a backlog reported twice) or
// for neither (a stall that never shows), or a flag-clear group as the
// dispatcher's stall.
func TestDueGaugesCountSharedRowsOnce(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	now := store.NowMs()
	for i := range 5 {
		e := fftest.Exec{Partition: int16(i)}
		if i < 2 {
			e.Policy = map[string]any{"retry_policy": map[string]any{"max_retries": 1}}
		}
		id := fftest.InsertExec(t, db.Pool, e)
		fftest.InsertAttempt(t, db.Pool, int16(i), id, 0, fftest.Ms(now-2000))
	}
	flow := fftest.NewUUID()
	down := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: 9, FlowID: flow})
	fftest.InsertEdgeGroup(t, db.Pool, fftest.EdgeGroup{Partition: 9, FlowID: flow, DownstreamEID: down})
	fftest.InsertPendingCancel(t, db.Pool, 9, flow, down, now-2000)

	tests := []struct {
		name      string
		intervals map[string]time.Duration
		want      map[string]float64
	}{
		{"Both", fleettest.Fast(workers.LeaseExpiry, workers.AttemptTimeout, workers.CancelDispatch),
			map[string]float64{"lease_expiry": 3, "attempt_timeout": 2, "cancel_dispatch": 0, "cancel_reconcile": 1}},
		{"LeaseExpiryOnly", fleettest.Fast(workers.LeaseExpiry), map[string]float64{"lease_expiry": 5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := metrics.New(metrics.Config{Stats: workers.NewStats(), Pool: db.Pool, RiverSchema: testdb.RiverSchema, Intervals: tt.intervals, ReadTimeout: slowRead})
			body := scrape(t, m)
			for name, want := range tt.want {
				if v := value(t, body, `ffreconcile_due_rows{reconciler="`+name+`"}`); v != want {
					t.Errorf("due_rows{%s} = %v; want %v", name, v, want)
				}
				oldest := value(t, body, `ffreconcile_oldest_due_seconds{reconciler="`+name+`"}`)
				if (want > 0) != (oldest >= 2) || (want == 0 && oldest != 0) {
					t.Errorf("oldest_due_seconds{%s} = %v with %v rows 2 s overdue", name, oldest, want)
				}
			}
		})
	}
}
