package chaostest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/fleettest"
	"github.com/flowfabric/ffreconcile/internal/heartbeat"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
)

// Fleets configured differently (docs/deployment.md): processes of one
// River schema run one configuration, a process configured otherwise
// refuses to start, and separate configurations run as separate fleets,
// each in its own River schema. These tests run real `worker run`
// processes.

// startWorker starts a `worker run` process on dbURL and waits until it is
// ready; it is killed when t ends, and its log shown if t failed.
func startWorker(t *testing.T, dbURL, clientID string, args ...string) *proc {
	t.Helper()
	p := newProc(t, workerBinary(t), dbURL, clientID, args...)
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("---- log of %s ----\n%s", clientID, p.logTail(40))
		}
	})
	if err := p.startReady(90 * time.Second); err != nil {
		t.Fatal(err)
	}
	return p
}

// refusedStart runs `worker run` with args on dbURL and checks that it
// exits 1 with one error line containing each of want.
func refusedStart(t *testing.T, dbURL string, args []string, want ...string) {
	t.Helper()
	args = append([]string{"run", "--database-url", dbURL, "--http-addr", "", "--log-format", "json", "--ui=false"}, args...)
	code, _, stderr := runBinary(t, 90*time.Second, args...)
	var errLines []string
	for _, line := range strings.Split(strings.TrimSpace(stderr), "\n") {
		if !strings.HasPrefix(line, "{") {
			errLines = append(errLines, line)
		}
	}
	if code != 1 || len(errLines) != 1 || !strings.HasPrefix(errLines[0], "worker run: ") {
		t.Fatalf("exit %d, error lines %q; want exit 1 and one line", code, errLines)
	}
	for _, w := range want {
		if !strings.Contains(errLines[0], w) {
			t.Errorf("error %q does not say %q", errLines[0], w)
		}
	}
}

// migrateRiverSchema runs `worker migrate --river-schema schema`.
func migrateRiverSchema(t *testing.T, dbURL, schema string) {
	t.Helper()
	if code, _, stderr := runBinary(t, 2*time.Minute, "migrate", "--database-url", dbURL, "--river-schema", schema); code != 0 {
		t.Fatalf("worker migrate --river-schema %s: exit %d: %s", schema, code, stderr)
	}
}

// TestOneConfigurationPerRiverSchema: whichever configuration starts first
// (and so leads), a process configured otherwise exits with one line naming
// the difference and --river-schema, and touches nothing; a process
// configured alike joins. A regression lets the second start, and the
// leader's River then ticks only its own reconcilers (the 0 of 20
// promotions).
func TestOneConfigurationPerRiverSchema(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name          string
		first, second []string
		want          string
	}{
		{"LeasesThenPromotions", []string{"--reconcilers", "lease_expiry"}, []string{"--reconcilers", "delayed_promotion"},
			"reconcilers delayed_promotion here, lease_expiry there"},
		{"PromotionsThenLeases", []string{"--reconcilers", "delayed_promotion"}, []string{"--reconcilers", "lease_expiry"},
			"reconcilers lease_expiry here, delayed_promotion there"},
		{"Tenants", []string{"--reconcilers", "lease_expiry", "--namespace", "acme"},
			[]string{"--reconcilers", "lease_expiry", "--namespace", "beta"}, "namespace beta here, acme there"},
		{"Interval", []string{"--reconcilers", "lease_expiry", "--lease-expiry-interval", "2s"},
			[]string{"--reconcilers", "lease_expiry", "--lease-expiry-interval", "1s"}, "lease_expiry interval 1s here, 2s there"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			startWorker(t, db.URL, "first", tt.first...)
			refusedStart(t, db.URL, tt.second, tt.want, "live process first", "--river-schema")
			if n := fftest.Count(t, db.Pool, `SELECT count(*) FROM river.ffreconcile_worker`); n != 1 {
				t.Errorf("%d heartbeat rows; want the first process's only", n)
			}
			if tt.name == "LeasesThenPromotions" {
				startWorker(t, db.URL, "alike", tt.first...)
			}
		})
	}
}

// TestKilledFleetGivesWay: a fleet killed without a clean stop keeps its
// heartbeat rows; another configuration is refused until they are older
// than heartbeat.LiveFor, then starts and serves its reconciler. A
// regression refuses it for good (stale rows counted as live) or lets it in
// while the killed fleet could still be running.
func TestKilledFleetGivesWay(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	a := startWorker(t, db.URL, "leases", "--reconcilers", "lease_expiry")
	a.kill()
	refusedStart(t, db.URL, []string{"--reconcilers", "delayed_promotion"}, "reconcilers delayed_promotion here, lease_expiry there")

	fleettest.WaitFor(t, 3*(heartbeat.LiveFor+30*time.Second), "the killed process's heartbeat to age", func() (bool, string) {
		n := fftest.Count(t, db.Pool, `SELECT count(*) FROM river.ffreconcile_worker
			 WHERE heartbeat_at >= now() - $1::bigint * interval '1 millisecond'`, heartbeat.LiveFor.Milliseconds())
		return n == 0, fleettest.Statusf("%d live rows", n)
	})
	p := int16(3)
	id := fftest.InsertExec(t, db.Pool, fftest.Delayed(p, store.NowMs()-1000))
	startWorker(t, db.URL, "promotions", "--reconcilers", "delayed_promotion", "--delayed-promotion-interval", "1s")
	fleettest.WaitFor(t, fleettest.Patient, "the delayed execution promoted", func() (bool, string) {
		n := fftest.Count(t, db.Pool, `SELECT count(*) FROM ff_exec_core WHERE partition_key = $1 AND execution_id = $2
			 AND eligibility_state = 'eligible_now'`, p, id)
		return n == 1, "not yet"
	})
}

// TestFleetsInTheirOwnSchemas: two tenants' fleets, with different
// reconcilers, each in its own River schema, over rows of both tenants in
// the same partitions: each row is acted on once, by its own tenant's fleet
// and rules (acme runs no promotion, so acme's delayed rows stay delayed),
// and neither schema holds a job for the other tenant's rows. A job for a
// third tenant's due row, inserted into acme's schema by raw SQL, is
// cancelled and its row left unchanged. A regression starves one tenant,
// lets a fleet change the other's rows, or completes the stray job.
func TestFleetsInTheirOwnSchemas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	migrateRiverSchema(t, db.URL, "river_beta")

	past := fftest.Ms(store.NowMs() - 2000)
	tenantOf := map[string]string{}
	var acmeDelayed, betaDelayed []string
	for p := range int16(8) {
		for _, tenant := range []string{"acme", "beta"} {
			id := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p, Namespace: tenant})
			fftest.InsertAttempt(t, db.Pool, p, id, 0, past)
			tenantOf[id] = tenant
			d := fftest.Delayed(p, store.NowMs()-1000)
			d.Namespace = tenant
			delayed := fftest.InsertExec(t, db.Pool, d)
			tenantOf[delayed] = tenant
			if tenant == "acme" {
				acmeDelayed = append(acmeDelayed, delayed)
			} else {
				betaDelayed = append(betaDelayed, delayed)
			}
		}
	}
	stray := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: 5, Namespace: "gamma"})
	fftest.InsertAttempt(t, db.Pool, 5, stray, 0, past)

	startWorker(t, db.URL, "acme", "--namespace", "acme", "--reconcilers", "lease_expiry", "--lease-expiry-interval", "1s")
	startWorker(t, db.URL, "beta", "--river-schema", "river_beta", "--namespace", "beta",
		"--reconcilers", "lease_expiry,delayed_promotion", "--lease-expiry-interval", "1s", "--delayed-promotion-interval", "1s")
	strayJob := db.InsertRawJob(t, "ff.lease_expiry.release", "ff_rows", "available",
		fmt.Sprintf(`{"partition": 5, "execution_id": %q, "attempt_index": 0}`, stray))

	fleettest.WaitFor(t, 135*time.Second, "both tenants' leases released and beta's delayed rows promoted", func() (bool, string) {
		leases := fftest.Count(t, db.Pool, `SELECT count(*) FROM ff_attempt a JOIN ff_exec_core e USING (partition_key, execution_id)
			 WHERE a.lease_expires_at_ms IS NOT NULL AND e.raw_fields->>'namespace' IN ('acme', 'beta')`)
		promoted := fftest.Count(t, db.Pool, `SELECT count(*) FROM ff_exec_core WHERE execution_id = ANY($1::uuid[])
			 AND eligibility_state = 'eligible_now'`, betaDelayed)
		return leases == 0 && promoted == len(betaDelayed), fleettest.Statusf("%d leases held, %d of %d promoted", leases, promoted, len(betaDelayed))
	})
	// Each lease event once, carrying its own tenant; acme's delayed rows
	// untouched.
	rows, err := db.Pool.Query(ctx, `SELECT execution_id, count(*), min(namespace) FROM ff_lease_event GROUP BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	type ev struct {
		n  int
		ns string
	}
	events, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (struct {
		id string
		ev
	}, error) {
		var x struct {
			id string
			ev
		}
		return x, r.Scan(&x.id, &x.n, &x.ns)
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(events) != 16 {
		t.Errorf("lease events for %d executions; want 16", len(events))
	}
	for _, e := range events {
		if e.n != 1 || e.ns != tenantOf[e.id] {
			t.Errorf("execution %s (tenant %s): %d events, namespace %s", e.id, tenantOf[e.id], e.n, e.ns)
		}
	}
	if n := fftest.Count(t, db.Pool, `SELECT count(*) FROM ff_exec_core WHERE execution_id = ANY($1::uuid[])
		 AND eligibility_state = 'not_eligible_until_time'`, acmeDelayed); n != len(acmeDelayed) {
		t.Errorf("%d of acme's %d delayed rows still delayed; acme's fleet runs no promotion", n, len(acmeDelayed))
	}
	// Each schema's row jobs name only its own tenant's executions.
	for schema, tenant := range map[string]string{"river": "acme", "river_beta": "beta"} {
		ids := jobExecutions(t, ctx, db.Pool, schema, strayJob)
		for _, id := range ids {
			if tenantOf[id] != tenant {
				t.Errorf("schema %s holds a job for execution %s of tenant %q", schema, id, tenantOf[id])
			}
		}
		if len(ids) == 0 {
			t.Errorf("schema %s holds no row job", schema)
		}
	}
	// The stray job: cancelled with its reason, its row unchanged.
	fleettest.WaitFor(t, fleettest.Patient, "the stray job cancelled", func() (bool, string) {
		var state, lastErr string
		if err := db.Pool.QueryRow(ctx, `SELECT state::text, COALESCE(errors[cardinality(errors)]->>'error', '')
			 FROM river.river_job WHERE id = $1`, strayJob).Scan(&state, &lastErr); err != nil {
			t.Fatal(err)
		}
		return state == "cancelled" && strings.Contains(lastErr, "outside this fleet's tenant filter"),
			fleettest.Statusf("job %s: %q", state, lastErr)
	})
	if att := fftest.ReadAttempt(t, db.Pool, 5, stray, 0); att.LeaseExpiresAtMs == nil {
		t.Error("the third tenant's lease was released by acme's fleet")
	}
}

// jobExecutions returns the execution ids of the row jobs in schema's
// river_job, but the job skip.
func jobExecutions(t *testing.T, ctx context.Context, pool *pgxpool.Pool, schema string, skip int64) []string {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT DISTINCT args->>'execution_id' FROM `+pgx.Identifier{schema, "river_job"}.Sanitize()+`
		 WHERE queue = 'ff_rows' AND args ? 'execution_id' AND id <> $1`, skip)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// TestChangingSettingsThroughANewSchema: the documented way to change a
// running fleet's settings (docs/deployment.md): a process with the new
// interval is refused in the old schema; started in a new one next to the
// old fleet, it ticks at its own interval at once; the old fleet then
// stops. Leases falling due all along are each released once, none missed
// while both ran or after the switch. A regression loses or doubles a
// release, or the new interval does not take effect.
func TestChangingSettingsThroughANewSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	old := startWorker(t, db.URL, "v1", "--reconcilers", "lease_expiry", "--lease-expiry-interval", "3s")

	feedCtx, stopFeed := context.WithCancel(ctx)
	fed := make(chan []string, 1)
	go func() {
		var ids []string
		defer func() { fed <- ids }()
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-feedCtx.Done():
				return
			case <-tick.C:
			}
			p := int16(i % 16)
			id := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p})
			fftest.InsertAttempt(t, db.Pool, p, id, 0, fftest.Ms(store.NowMs()+500))
			ids = append(ids, id)
		}
	}()

	time.Sleep(3 * time.Second)
	refusedStart(t, db.URL, []string{"--reconcilers", "lease_expiry", "--lease-expiry-interval", "1s"},
		"lease_expiry interval 1s here, 3s there")
	migrateRiverSchema(t, db.URL, "river_v2")
	startWorker(t, db.URL, "v2", "--river-schema", "river_v2", "--reconcilers", "lease_expiry", "--lease-expiry-interval", "1s")
	time.Sleep(3 * time.Second)
	if err := old.stop(); err != nil {
		t.Fatalf("stop the old fleet: %v", err)
	}
	time.Sleep(4 * time.Second)
	stopFeed()
	ids := <-fed

	fleettest.WaitFor(t, fleettest.Patient, "every lease released", func() (bool, string) {
		n := fftest.Count(t, db.Pool, `SELECT count(*) FROM ff_attempt WHERE lease_expires_at_ms IS NOT NULL`)
		return n == 0, fleettest.Statusf("%d of %d leases held", n, len(ids))
	})
	if n := fftest.Count(t, db.Pool, `SELECT count(*) FROM (SELECT execution_id FROM ff_lease_event GROUP BY 1 HAVING count(*) <> 1) x`); n != 0 {
		t.Errorf("%d executions without exactly one lease event", n)
	}
	if n := fftest.Count(t, db.Pool, `SELECT count(DISTINCT execution_id) FROM ff_lease_event`); n != len(ids) {
		t.Errorf("lease events for %d executions; want %d", n, len(ids))
	}
	// The new fleet's leader ticks at 1 s: its periodic ticks of the last
	// 5 s are 1 s apart, where the old fleet's were 3 s. Polled: on a
	// loaded machine a tick can be a moment late, which leaves only two in
	// some 5 s window.
	fleettest.WaitFor(t, fleettest.Patient, "the new schema's ticks at the 1 s interval", func() (bool, string) {
		var ticks int
		var minGap float64
		if err := db.Pool.QueryRow(ctx, `
			SELECT count(*), COALESCE(min(gap), 0) FROM (
			  SELECT extract(epoch FROM scheduled_at - lag(scheduled_at) OVER (ORDER BY scheduled_at)) AS gap
			    FROM river_v2.river_job WHERE kind = 'ff.lease_expiry.tick' AND scheduled_at > now() - interval '5 seconds') x`).
			Scan(&ticks, &minGap); err != nil {
			t.Fatal(err)
		}
		return ticks >= 3 && minGap <= 1.5, fleettest.Statusf("%d ticks in the last 5 s, closest %.1fs apart", ticks, minGap)
	})
}
