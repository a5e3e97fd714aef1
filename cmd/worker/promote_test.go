package main

import (
	"context"
	"io"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/internal/fleettest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
)

const promoteTestUUID = "6f1c0b1e-2d3a-4b5c-8d9e-0a1b2c3d4e5f"

func TestPromoteBadInputFailsWithOneClearLine(t *testing.T) {
	for _, env := range []string{"DATABASE_URL", "FF_RIVER_SCHEMA", "FF_PROMOTE_EXECUTION", "FF_PROMOTE_PARTITION", "FF_PROMOTE_EXECUTION_ID", "FF_PROMOTE_AT"} {
		t.Setenv(env, "")
	}
	u := promoteTestUUID
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"Neither", nil, "worker promote: no execution given: use --execution '{fp:N}:<uuid>', or --partition N with --execution-id UUID"},
		{"Both", []string{"--execution", "{fp:7}:" + u, "--partition", "7", "--execution-id", u}, "worker promote: give either --execution or --partition with --execution-id, not both"},
		{"BothExecutionAndID", []string{"--execution", "{fp:7}:" + u, "--execution-id", u}, "not both"},
		{"MalformedExecution", []string{"--execution", "7:" + u}, `worker promote: --execution: execution id "7:` + u + `": want the form {fp:N}:<uuid>`},
		{"ExecutionNotAUUID", []string{"--execution", "{fp:7}:nope"}, `worker promote: --execution: execution id "{fp:7}:nope": "nope" is not a UUID (want 8-4-4-4-12 hex digits)`},
		{"ExecutionPartition256", []string{"--execution", "{fp:256}:" + u}, "partition 256 is out of range 0..255"},
		{"NotAUUID", []string{"--partition", "7", "--execution-id", "nope"}, `worker promote: --execution-id: "nope" is not a UUID (want 8-4-4-4-12 hex digits)`},
		{"Partition256", []string{"--partition", "256", "--execution-id", u}, "worker promote: --partition: partition 256 is out of range 0..255"},
		{"PartitionMinus1", []string{"--partition", "-1", "--execution-id", u}, "worker promote: --partition: partition -1 is out of range 0..255"},
		{"PartitionNotANumber", []string{"--partition", "seven", "--execution-id", u}, `worker promote: --partition "seven" is not a whole number`},
		{"PartitionAlone", []string{"--partition", "7"}, "worker promote: --partition needs --execution-id"},
		{"ExecutionIDAlone", []string{"--execution-id", u}, "worker promote: --execution-id needs --partition"},
		{"BadTime", []string{"--execution", "{fp:7}:" + u, "--at", "tomorrow"}, `worker promote: --at "tomorrow": want an RFC 3339 time (2026-05-01T12:30:00Z) or a duration from now (30s, 5m)`},
		{"TimeWithoutZone", []string{"--execution", "{fp:7}:" + u, "--at", "2026-05-01T12:30:00"}, "want an RFC 3339 time"},
		{"NegativeDuration", []string{"--execution", "{fp:7}:" + u, "--at", "-5s"}, "worker promote: --at -5s: a duration counts from now and must not be negative"},
		{"BadSchema", []string{"--execution", "{fp:7}:" + u, "--river-schema", "x;drop"}, "invalid River schema name"},
		{"ExtraArgument", []string{"--execution", "{fp:7}:" + u, "now"}, `unexpected argument "now"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runMain(t, context.Background(), append([]string{"promote"}, tt.args...)...)
			if code != 2 {
				t.Errorf("exit code %d; want 2 (stderr %q)", code, stderr)
			}
			if !strings.Contains(stderr, tt.want) {
				t.Errorf("stderr %q does not contain %q", stderr, tt.want)
			}
			if lines := strings.Split(strings.TrimSpace(stderr), "\n"); len(lines) != 1 || !strings.HasPrefix(lines[0], "worker promote: ") {
				t.Errorf("want exactly one line starting with \"worker promote: \"; stderr %q", stderr)
			}
			if stdout != "" {
				t.Errorf("stdout %q; want nothing", stdout)
			}
		})
	}
}

func TestPromoteFlagsAt(t *testing.T) {
	t.Setenv("FF_PROMOTE_AT", "")
	now := time.Date(2026, 5, 1, 12, 0, 0, 123_456_789, time.UTC)
	tests := []struct {
		at   string
		want time.Time
	}{
		{"30s", time.Date(2026, 5, 1, 12, 0, 30, 123_000_000, time.UTC)},
		{"0s", time.Date(2026, 5, 1, 12, 0, 0, 123_000_000, time.UTC)},
		{"2026-05-01T14:30:00+02:00", time.Date(2026, 5, 1, 12, 30, 0, 0, time.UTC)},
		{"2026-05-01T12:30:00.5Z", time.Date(2026, 5, 1, 12, 30, 0, 500_000_000, time.UTC)},
	}
	for _, tt := range tests {
		pc, err := parsePromoteFlags([]string{"--execution", "{fp:7}:" + promoteTestUUID, "--at", tt.at}, io.Discard, now)
		if err != nil {
			t.Fatalf("--at %s: %v", tt.at, err)
		}
		if pc.args.At == nil || !pc.args.At.Equal(tt.want) {
			t.Errorf("--at %s = %v; want %s", tt.at, pc.args.At, tt.want)
		}
	}
	// The target is normalised: one execution, one unique key.
	pc, err := parsePromoteFlags([]string{"--partition", "07", "--execution-id", strings.ToUpper(promoteTestUUID)}, io.Discard, now)
	if err != nil {
		t.Fatal(err)
	}
	if *pc.args.Partition != 7 || pc.args.ExecutionID != promoteTestUUID || pc.args.At != nil {
		t.Fatalf("args = %+v; want partition 7, lower-case UUID, no at", pc.args)
	}
}

func TestPromoteHelpListsFlagsAndEnvVars(t *testing.T) {
	code, out, _ := runMain(t, context.Background(), "promote", "--help")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{"--database-url", "DATABASE_URL", "--river-schema", "FF_RIVER_SCHEMA", "(default river)",
		"--execution", "FF_PROMOTE_EXECUTION", "--partition", "FF_PROMOTE_PARTITION", "--execution-id", "FF_PROMOTE_EXECUTION_ID",
		"--at", "FF_PROMOTE_AT", "duration from now", "river.ffreconcile_promote(7::smallint"} {
		if !strings.Contains(out, want) {
			t.Errorf("promote --help lacks %q", want)
		}
	}
	if code, out, _ := runMain(t, context.Background(), "--help"); code != 0 || !strings.Contains(out, "promote") {
		t.Errorf("worker --help does not list promote: %q", out)
	}
}

// TestPromoteEnqueuesAndFleetPromotes: `worker promote` prints the job id,
// a repeat is skipped naming the queued job, and a running fleet (without
// the sweep) promotes both executions, one of them scheduled with --at.
func TestPromoteEnqueuesAndFleetPromotes(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	ctx := context.Background()
	db := testdb.New(t)
	now := store.NowMs()
	a := fftest.InsertExec(t, db.Pool, fftest.Delayed(7, now-1000))
	b := fftest.InsertExec(t, db.Pool, fftest.Delayed(200, now+1000))

	code, out, stderr := runMain(t, ctx, "promote", "--database-url", db.URL, "--execution", "{fp:7}:"+a)
	if code != 0 {
		t.Fatalf("promote: exit %d, stderr %q", code, stderr)
	}
	m := regexp.MustCompile(`^enqueued job (\d+): promote \{fp:7\}:` + a + ` now\n$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("stdout %q; want the job id", out)
	}
	code, out, stderr = runMain(t, ctx, "promote", "--database-url", db.URL, "--execution", "{fp:7}:"+strings.ToUpper(a))
	if code != 0 || out != "skipped: an identical promotion is already queued (job "+m[1]+")\n" {
		t.Fatalf("repeat: exit %d, stdout %q, stderr %q; want skipped naming job %s", code, out, stderr, m[1])
	}
	code, out, stderr = runMain(t, ctx, "promote", "--database-url", db.URL, "--partition", "200", "--execution-id", b, "--at", "1s")
	sched := regexp.MustCompile(`^enqueued job (\d+): promote \{fp:200\}:` + b + ` at (20\d\d-\S+)\n$`).FindStringSubmatch(out)
	if code != 0 || sched == nil {
		t.Fatalf("scheduled: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	// Another service's SQL call for the same promotion finds the CLI's.
	var sqlJob int64
	var dup bool
	if err := db.Pool.QueryRow(ctx, `SELECT job_id, duplicate FROM river.ffreconcile_promote(200::smallint, $1::uuid, $2::timestamptz)`,
		b, sched[2]).Scan(&sqlJob, &dup); err != nil || !dup || strconv.FormatInt(sqlJob, 10) != sched[1] {
		t.Fatalf("SQL call after the CLI: job %d, duplicate %v, %v; want job %s, duplicate", sqlJob, dup, err, sched[1])
	}
	// A promotion that would change nothing as things stand is enqueued
	// all the same (the execution may be written later), with a note.
	missing, running := fftest.NewUUID(), fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: 9})
	for _, c := range []struct{ id, note string }{
		{"{fp:9}:" + missing, `note: execution \{fp:9\}:` + missing + ` is not in ff_exec_core \(yet\)`},
		{"{fp:9}:" + running, `note: execution \{fp:9\}:` + running + ` is not delayed \(public state running\)`},
	} {
		code, out, stderr = runMain(t, ctx, "promote", "--database-url", db.URL, "--execution", c.id)
		if re := `^enqueued job \d+: promote .* now\n` + c.note + `.*changes nothing\n$`; code != 0 || !regexp.MustCompile(re).MatchString(out) {
			t.Fatalf("promote %s: exit %d, stdout %q, stderr %q; want it enqueued with a note matching %s", c.id, code, out, stderr, re)
		}
	}
	code, _, stderr = runMain(t, ctx, "promote", "--database-url", db.URL, "--river-schema", "elsewhere", "--execution", "{fp:7}:"+a)
	if code != 1 || !strings.Contains(stderr, `River's tables are missing from schema "elsewhere"`) {
		t.Fatalf("missing schema: exit %d, stderr %q; want 1 naming the schema", code, stderr)
	}

	fleettest.Start(t, db, fleet.Config{Reconcilers: map[string]time.Duration{}})
	for _, e := range []struct {
		p  int16
		id string
	}{{7, a}, {200, b}} {
		fleettest.WaitFor(t, fleettest.Patient, "execution promoted", func() (bool, string) {
			ex := fftest.ReadExec(t, db.Pool, e.p, e.id)
			return ex.EligibilityState == "eligible_now", fleettest.Statusf("%+v", ex)
		})
	}
}
