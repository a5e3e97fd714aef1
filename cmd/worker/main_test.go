package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/internal/fleettest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/internal/testlog"
	"github.com/flowfabric/ffreconcile/workers"
)

// runMain runs the command line in-process and returns exit code, stdout
// and stderr.
func runMain(t *testing.T, ctx context.Context, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := mainWithExit(ctx, args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestBadInvocationsFailWithOneClearLine(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"UnknownCommand", []string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{"UnknownFlag", []string{"run", "--no-such-flag"}, 2, "flag provided but not defined: --no-such-flag"},
		{"BadDuration", []string{"run", "--lease-expiry-interval", "soon"}, 2, `--lease-expiry-interval soon: "soon" is not a duration`},
		{"ZeroInterval", []string{"run", "--lease-expiry-interval", "0s"}, 2, "--lease-expiry-interval 0s: must be positive"},
		{"NegativeInterval", []string{"run", "--suspension-timeout-interval", "-1s"}, 2, "--suspension-timeout-interval -1s: must be positive"},
		{"SubSecondInterval", []string{"run", "--lease-expiry-interval", "200ms"}, 2, "--lease-expiry-interval 200ms: interval too short (minimum 1s)"},
		{"PartitionCount", []string{"run", "--partition-count", "300"}, 2, "--partition-count 300: out of range 1..256"},
		{"BatchSize", []string{"run", "--batch-size", "0"}, 2, "--batch-size 0: must be at least 1"},
		{"BatchSizeTooLarge", []string{"run", "--batch-size", "10001"}, 2, "--batch-size 10001: out of range 1..10000"},
		{"InstanceTagWithoutEquals", []string{"run", "--instance-tag", "cairn.instance_id"}, 2, "want KEY=VALUE"},
		{"UnknownReconciler", []string{"run", "--reconcilers", "lease_expiry,nope"}, 2, `unknown reconciler "nope"`},
		{"RowBatchOutOfRange", []string{"run", "--row-batch", "5000"}, 2, "--row-batch 5000: out of range 1..1000"},
		{"DispatchLanesOutOfRange", []string{"run", "--dispatch-lanes", "65"}, 2, "--dispatch-lanes 65: out of range 1..64 (0 on the command line, -1 in fleet.Config: none)"},
		{"DispatchLanesNegative", []string{"run", "--dispatch-lanes", "-1"}, 2, "--dispatch-lanes -1: must not be negative (0 turns it off)"},
		{"LookaheadTooLong", []string{"run", "--lookahead", "6s"}, 2, "--lookahead 6s: too long (at most 5s)"},
		{"BenchUnknownReconciler", []string{"bench", "--reconciler", "promote"}, 2, `unknown reconciler "promote"`},
		{"BenchUnknownCommit", []string{"bench", "--commit", "sometimes"}, 2, `unknown --commit "sometimes"`},
		{"BenchBadLead", []string{"bench", "--lateness-lead", "1s,soon"}, 2, `bad --lateness-lead "soon" (want a duration above 0 and at most 1m, e.g. 1s)`},
		{"BadSchema", []string{"run", "--river-schema", "x;drop"}, 2, "invalid River schema name"},
		{"BadLogLevel", []string{"run", "--log-level", "loud"}, 2, `log level "loud"`},
		{"UnreachableDatabase", []string{"migrate", "--database-url", "postgres://u:sekret@127.0.0.1:1/x?connect_timeout=2"}, 1, "cannot reach database postgres://u:xxxxx@127.0.0.1:1/x"},
		{"MalformedURL", []string{"run", "--database-url", "postgres://u:sekret@[::1"}, 2, "invalid database URL postgres://u:xxxxx@"},
		{"RetentionReconcilerWithoutRetention", []string{"run", "--reconcilers", "retention"}, 2, "--reconcilers retention: runs only with --retention (delete ended executions (terminal or cancelled)"},
		{"NegativeRetention", []string{"run", "--retention", "-1h"}, 2, "--retention -1h: must not be negative (0 turns it off)"},
		{"SubSecondRetention", []string{"run", "--retention", "500ms"}, 2, "--retention 500ms: too short (minimum 1s)"},
		{"SubSecondOutboxRetention", []string{"run", "--outbox-retention", "10ms"}, 2, "--outbox-retention 10ms: too short"},
		{"SubSecondReindexInterval", []string{"run", "--river-reindex-interval", "10ms"}, 2, "--river-reindex-interval 10ms: too short (minimum 1s)"},
		{"NegativeReindexInterval", []string{"run", "--river-reindex-interval", "-1h"}, 2, "--river-reindex-interval -1h: must be positive"},
		// A tenant's fleet would trim every tenant's outbox events: refused,
		// naming where to run it instead.
		{"OutboxRetentionWithNamespace", []string{"run", "--namespace", "acme", "--outbox-retention", "1h"}, 2,
			"--outbox-retention 1h0m0s: cannot run in a fleet with a tenant filter (namespace acme): the lease and completion outboxes are shared by every tenant"},
		{"OutboxRetentionWithInstanceTag", []string{"run", "--instance-tag", "cairn.instance_id=i-1", "--outbox-retention", "1h"}, 2,
			"run --outbox-retention in one fleet without --namespace and --instance-tag"},
		{"ZeroOutboxInterval", []string{"run", "--outbox-retention-interval", "0s"}, 2, "--outbox-retention-interval 0s: must be positive"},
		// Zero means what it says: refused where the setting cannot be off
		// (it once silently became the default).
		{"ZeroCompletedJobRetention", []string{"run", "--completed-job-retention", "0"}, 2, "--completed-job-retention 0: must be positive"},
		{"ZeroRescueStuckJobsAfter", []string{"run", "--rescue-stuck-jobs-after", "0"}, 2, "--rescue-stuck-jobs-after 0: must be positive"},
		{"ZeroRowFetchCooldown", []string{"run", "--row-fetch-cooldown", "0"}, 2, "--row-fetch-cooldown 0: must be positive"},
		{"ZeroReindexInterval", []string{"run", "--river-reindex-interval", "0"}, 2, "--river-reindex-interval 0: must be positive"},
		{"ZeroRowStatements", []string{"run", "--row-statements", "0"}, 2, "--row-statements 0: must be at least 1"},
		{"NegativeLookahead", []string{"run", "--lookahead", "-1s"}, 2, "--lookahead -1s: must not be negative (0 turns it off)"},
		{"RowFetchCooldownBelowRiver", []string{"run", "--row-fetch-cooldown", "100us"}, 2, "--row-fetch-cooldown 100µs: too short (minimum 1ms)"},
		{"StatusNegativeRetention", []string{"status", "--retention", "-5m"}, 2, "--retention -5m: must not be negative (0 turns it off)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, stderr := runMain(t, context.Background(), tt.args...)
			if code != tt.code {
				t.Errorf("exit code %d; want %d (stderr %q)", code, tt.code, stderr)
			}
			if !strings.Contains(stderr, tt.want) {
				t.Errorf("stderr %q does not contain %q", stderr, tt.want)
			}
			// Log lines (time=...) may precede it; the error itself is one line.
			var errLines []string
			for _, line := range strings.Split(strings.TrimSpace(stderr), "\n") {
				if !strings.HasPrefix(line, "time=") {
					errLines = append(errLines, line)
				}
			}
			if len(errLines) != 1 || !strings.HasPrefix(errLines[0], "worker") {
				t.Errorf("want exactly one error line starting with \"worker\"; stderr %q", stderr)
			}
			if strings.Contains(stderr, "sekret") || strings.Contains(stderr, "panic") {
				t.Errorf("stderr leaks a password or a panic: %q", stderr)
			}
		})
	}
}

func TestHelpListsEveryFlagWithItsEnvVar(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://u:topsecret@db/x")
	code, out, _ := runMain(t, context.Background(), "run", "--help")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{"--database-url", "DATABASE_URL", "--lease-expiry-interval", "FF_LEASE_EXPIRY_INTERVAL",
		"(default 1.5s)", "--http-addr", "(default 127.0.0.1:8080)", "--log-format", "--shutdown-timeout"} {
		if !strings.Contains(out, want) {
			t.Errorf("run --help lacks %q", want)
		}
	}
	if strings.Contains(out, "topsecret") {
		t.Error("--help prints the database password")
	}
}

func TestRunWithoutFFTablesFailsNamingThem(t *testing.T) {
	db := testdb.NewEmpty(t)
	code, out, stderr := runMain(t, context.Background(), "migrate", "--database-url", db.URL)
	if code != 0 {
		t.Fatalf("migrate (River only): exit %d, %s", code, stderr)
	}
	if !strings.Contains(out, "river: applied migrations") {
		t.Fatalf("migrate output %q", out)
	}
	code, _, stderr = runMain(t, context.Background(), "run", "--database-url", db.URL, "--http-addr", "")
	if code != 1 {
		t.Fatalf("run without ff tables: exit %d; want 1 (stderr %q)", code, stderr)
	}
	for _, want := range []string{"missing tables:", "ff_attempt", "ff_exec_core", "worker migrate --ff-schema"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr %q lacks %q", stderr, want)
		}
	}
}

func TestMigrateTwiceThenRunServesHealthAndUI(t *testing.T) {
	db := testdb.NewEmpty(t)
	for i := range 2 {
		code, out, stderr := runMain(t, context.Background(), "migrate", "--ff-schema", "--database-url", db.URL)
		if code != 0 {
			t.Fatalf("migrate #%d: exit %d: %s", i+1, code, stderr)
		}
		if i == 1 && (!strings.Contains(out, "already up to date") || !strings.Contains(out, "left existing tables untouched")) {
			t.Fatalf("second migrate output %q; want a no-op", out)
		}
		wantPF := []string{"promote function: installed river.ffreconcile_promote version 1", "promote function: river.ffreconcile_promote version 1 is in place"}[i]
		if !strings.Contains(out, wantPF) {
			t.Fatalf("migrate #%d output %q; want %q", i+1, out, wantPF)
		}
	}

	now := time.Now().UnixMilli()
	id := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: 17})
	fftest.InsertAttempt(t, db.Pool, 17, id, 0, fftest.Ms(now-5000))

	rc, err := parseRunFlags([]string{"--database-url", db.URL, "--http-addr", "127.0.0.1:0"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	started := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, rc, slog.New(slog.NewTextHandler(io.Discard, nil)), started) }()
	var addr string
	select {
	case addr = <-started:
	case err := <-done:
		t.Fatalf("run: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("run did not start")
	}
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 200, "/riverui/": 200, "/stats": 200} {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s = %d; want %d", path, resp.StatusCode, want)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for fftest.ReadAttempt(t, db.Pool, 17, id, 0).LeaseExpiresAtMs != nil {
		if time.Now().After(deadline) {
			t.Fatal("the worker did not release the expired lease")
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run returned %v after shutdown", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not stop")
	}
}

// TestBareCommandIsAUsageError: `worker` alone prints the usage on stderr
// and exits 2, as the README promises for usage errors; `worker help`
// prints it on stdout and exits 0. A regression exits 0 on a bare command,
// so a script calling it by mistake goes on as if it had worked.
func TestBareCommandIsAUsageError(t *testing.T) {
	code, stdout, stderr := runMain(t, context.Background())
	if code != 2 || stdout != "" || !strings.Contains(stderr, "Commands:") {
		t.Errorf("worker: exit %d, stdout %q, stderr %q; want 2 and the usage on stderr", code, stdout, stderr)
	}
	code, stdout, _ = runMain(t, context.Background(), "help")
	if code != 0 || !strings.Contains(stdout, "Commands:") {
		t.Errorf("worker help: exit %d, stdout %q; want 0 and the usage", code, stdout)
	}
}

// TestUnreachableDatabaseCauseOnce: pgx reports one line per connection
// attempt, and with sslmode=prefer an address is tried twice, failing
// alike; the message names the cause once. A regression prints the same
// "connection refused" twice on one line.
func TestUnreachableDatabaseCauseOnce(t *testing.T) {
	code, _, stderr := runMain(t, context.Background(), "status", "--database-url", "postgres://postgres@127.0.0.1:1/postgres?connect_timeout=2")
	if code != 1 || strings.Count(stderr, "connection refused") != 1 {
		t.Errorf("exit %d, stderr %q; want 1 and the cause once", code, stderr)
	}
}

// TestShutdownLetsRunningJobsFinish: on SIGINT/SIGTERM (the run context
// ending) running jobs get --shutdown-timeout to finish, as the README
// promises, and are not cancelled at once. Two expired leases in two
// partitions, both rows locked by the test, one row statement in flight:
// one release job's statement waits for its lock and the other job waits
// for the statement slot, on its own context. The run context is cancelled
// while both wait, and the locks are let go a moment later. A regression
// (River's client started with the signal's context, which River treats as
// StopAndCancel) cancels the waiting job at once: its lease is still held
// when run returns and its job is left to retry.
func TestShutdownLetsRunningJobsFinish(t *testing.T) {
	t.Parallel()
	bg := context.Background()
	db := testdb.New(t)
	var ids []string
	for _, p := range []int16{17, 18} {
		id := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p})
		fftest.InsertAttempt(t, db.Pool, p, id, 0, fftest.Ms(time.Now().UnixMilli()-5000))
		ids = append(ids, id)
	}
	lock, err := db.Pool.Begin(bg)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(bg)
	if _, err := lock.Exec(bg, `SELECT 1 FROM ff_attempt WHERE partition_key IN (17, 18) AND execution_id = ANY($1::uuid[]) FOR UPDATE`, ids); err != nil {
		t.Fatal(err)
	}

	rc, err := parseRunFlags([]string{"--database-url", db.URL, "--http-addr", "", "--reconcilers", "lease_expiry",
		"--row-statements", "1", "--shutdown-timeout", "30s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	done := make(chan error, 1)
	var logs testlog.Buffer
	go func() { done <- run(ctx, rc, slog.New(slog.NewTextHandler(&logs, nil)), nil) }()
	running := func() int {
		return fftest.Count(t, db.Pool, `SELECT count(*) FROM river.river_job WHERE kind = 'ff.lease_expiry.release' AND state = 'running'`)
	}
	fleettest.WaitFor(t, fleettest.Patient, "both release jobs to wait (one for its lock, one for the statement)", func() (bool, string) {
		return running() == 2, fleettest.Statusf("%d running", running())
	})
	cancel() // what SIGINT/SIGTERM does
	// The shutdown has begun (River stops fetching next) before the lock
	// goes: the two jobs are running across it.
	fleettest.WaitFor(t, fleettest.Patient, "the shutdown to begin", func() (bool, string) {
		return strings.Contains(logs.String(), "shutting down: no new jobs"), ""
	})
	if err := lock.Rollback(bg); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run returned %v after shutdown", err)
		}
	case <-time.After(40 * time.Second):
		t.Fatal("run did not stop")
	}
	for i, p := range []int16{17, 18} {
		if a := fftest.ReadAttempt(t, db.Pool, p, ids[i], 0); a.LeaseExpiresAtMs != nil {
			t.Errorf("the lease in partition %d is still held: its running release job was cancelled at shutdown instead of finishing", p)
		}
	}
	rows, err := db.Pool.Query(bg, `SELECT state || ' in attempt ' || attempt FROM river.river_job WHERE kind = 'ff.lease_expiry.release'`)
	if err != nil {
		t.Fatal(err)
	}
	states, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(states) != 2 || states[0] != "completed in attempt 1" || states[1] != "completed in attempt 1" {
		t.Fatalf("release jobs: %v; want both completed in their first attempt", states)
	}
}

// TestFilteredRunNamesReconcilersActingOnEveryTenant: `worker run` with a
// tenant filter logs once, at start, which of its enabled reconcilers act
// on every tenant's rows (workers.Reconciler.AllTenants: budget reset and
// the worker-registry TTL); without a filter, or without such a
// reconciler, it logs no such line. The database is unreachable, so run
// stops right after its start lines. A regression logs nothing (an
// operator of per-tenant fleets is not told that every fleet sweeps every
// tenant's budgets), names a reconciler that honours the filter, or logs
// the line more than once.
func TestFilteredRunNamesReconcilersActingOnEveryTenant(t *testing.T) {
	t.Parallel()
	// want derives the expected names from the registry, as the log does.
	want := func(enabled ...string) string {
		var names []string
		for _, r := range workers.All() {
			if r.AllTenants && (len(enabled) == 0 || slices.Contains(enabled, r.Name)) {
				names = append(names, r.Name)
			}
		}
		return strings.Join(names, ",")
	}
	tests := []struct {
		name string
		args []string
		want string // "" : no line
	}{
		{"NamespaceAllReconcilers", []string{"--namespace", "acme"}, want()},
		{"TagSome", []string{"--instance-tag", "cairn.instance_id=i-1", "--reconcilers", "lease_expiry,budget_reset"}, want("lease_expiry", "budget_reset")},
		{"FilterWithoutThem", []string{"--namespace", "acme", "--reconcilers", "lease_expiry,retention", "--retention", "24h"}, ""},
		{"NoFilter", nil, ""},
	}
	if want() == "" {
		t.Fatal("no reconciler of the registry has AllTenants: budget_reset and worker_registry_ttl should")
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			args := append([]string{"--database-url", "postgres://postgres@127.0.0.1:1/postgres?connect_timeout=2", "--http-addr", ""}, tt.args...)
			rc, err := parseRunFlags(args, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			if err := run(context.Background(), rc, slog.New(slog.NewJSONHandler(&buf, nil)), nil); err == nil {
				t.Fatal("run against an unreachable database returned nil")
			}
			var lines []map[string]any
			for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
				var m map[string]any
				if err := json.Unmarshal([]byte(line), &m); err != nil {
					t.Fatalf("log line %q: %v", line, err)
				}
				if m["msg"] == allTenantsNotice {
					lines = append(lines, m)
				}
			}
			switch {
			case tt.want == "" && len(lines) != 0:
				t.Errorf("logged %v; want no line about reconcilers acting on every tenant", lines)
			case tt.want != "" && len(lines) != 1:
				t.Errorf("logged %d lines about reconcilers acting on every tenant; want one:\n%s", len(lines), buf.String())
			case tt.want != "" && (lines[0]["reconcilers"] != tt.want || lines[0]["level"] != "WARN"):
				t.Errorf("logged %v; want a warning naming %s", lines[0], tt.want)
			}
		})
	}
}

// TestZeroTurnsOffWhatCanBeOff: on the command line 0 turns off the settings
// that can be off, and reaches fleet.Config as its "off" (workers.Off, since
// a zero there means the default), and an unset flag keeps the default
// --help shows. A regression shows as --lookahead 0 running with the
// default lookahead (it once did: fleet.Config read the 0 as "unset").
func TestZeroTurnsOffWhatCanBeOff(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	tests := []struct {
		name  string
		args  []string
		check func(c fleet.Config) bool
		want  string
	}{
		{"LookaheadOff", []string{"--lookahead", "0"}, func(c fleet.Config) bool { return c.WithDefaults().Lookahead < 0 }, "negative (off)"},
		{"LookaheadDefault", nil, func(c fleet.Config) bool { return c.WithDefaults().Lookahead == fleet.DefaultLookahead }, "the default"},
		{"DependencyStaleThresholdOff", []string{"--dependency-stale-threshold", "0"}, func(c fleet.Config) bool {
			return c.WithDefaults().Settings.Get(workers.DependencyStaleThreshold) == workers.Off
		}, "off"},
		{"DependencyStaleThresholdDefault", nil, func(c fleet.Config) bool {
			return c.WithDefaults().Settings.Get(workers.DependencyStaleThreshold) == 15*time.Second
		}, "FlowFabric's 15s"},
		{"RetentionOff", []string{"--retention", "0"}, func(c fleet.Config) bool { return !c.WithDefaults().Settings.On(workers.RetentionAge) }, "off"},
		{"RetentionUnset", nil, func(c fleet.Config) bool { return !c.WithDefaults().Settings.On(workers.RetentionAge) }, "off"},
		{"ReindexIntervalUnset", nil, func(c fleet.Config) bool { return c.WithDefaults().ReindexInterval == 0 }, "0 (River's)"},
		{"RowStatementsUnset", nil, func(c fleet.Config) bool { return c.WithDefaults().RowStatements == workers.DefaultRowStatements }, "the default"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rc, err := parseRunFlags(tt.args, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(rc.fleet) {
				t.Fatalf("%v: fleet.Config %+v; want %s", tt.args, rc.fleet.WithDefaults(), tt.want)
			}
		})
	}
}

// TestStartLogSaysOff: the "starting worker" line shows a setting turned
// off as off, as it was given (0), not as its value inside (-1ns, which
// reads as a negative threshold), and a set one as its duration.
func TestStartLogSaysOff(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	rc, err := parseRunFlags([]string{"--dependency-stale-threshold", "0", "--retention", "2h"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := settingsList(rc.fleet.Settings), "dependency-stale-threshold=off,retention=2h0m0s"; got != want {
		t.Errorf("settings logged as %q; want %q", got, want)
	}
}

// TestReadmeListsEveryRunFlag: README's configuration table has a row for
// every flag `worker run --help` lists, and no row for a flag it does not
// (every setting's flag comes from its one declaration, fleet.Config.Flags
// and the reconcilers' settings). A regression is a flag a reader of the
// README never learns of, or a row left for a flag that is gone.
func TestReadmeListsEveryRunFlag(t *testing.T) {
	var help strings.Builder
	if _, err := parseRunFlags([]string{"--help"}, &help); !errors.Is(err, errHelp) {
		t.Fatalf("--help: %v", err)
	}
	flagRE := regexp.MustCompile(`(?m)^\s*--([a-z0-9-]+)\s`)
	inHelp := map[string]bool{}
	for _, m := range flagRE.FindAllStringSubmatch(help.String(), -1) {
		inHelp[m[1]] = true
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(string(readme), "## Configuration (`worker run`)")
	j := strings.Index(string(readme)[i:], "\n## ")
	if i < 0 || j < 0 {
		t.Fatal("README has no configuration section")
	}
	rowRE := regexp.MustCompile("(?m)^\\| `--([a-z0-9-]+)` \\|")
	inReadme := map[string]bool{}
	for _, m := range rowRE.FindAllStringSubmatch(string(readme)[i:i+j], -1) {
		inReadme[m[1]] = true
	}
	if len(inHelp) < 30 {
		t.Fatalf("only %d flags found in --help: the pattern missed them\n%s", len(inHelp), help.String())
	}
	for f := range inHelp {
		if !inReadme[f] {
			t.Errorf("--%s is in `worker run --help` but not in README's configuration table", f)
		}
	}
	for f := range inReadme {
		if !inHelp[f] {
			t.Errorf("README's configuration table lists --%s, which `worker run --help` does not", f)
		}
	}
}
