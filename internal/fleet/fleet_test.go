package fleet

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

func TestRowStatementsDefault(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name              string
		synchronousCommit string
		rowStatements     int
		want              int
	}{
		{name: "commit waits for the flush", want: workers.DefaultRowStatements},
		{name: "explicit on", synchronousCommit: "on", want: workers.DefaultRowStatements},
		{name: "local still waits", synchronousCommit: "local", want: workers.DefaultRowStatements},
		{name: "off", synchronousCommit: "off", want: 1},
		{name: "explicit setting wins under off", synchronousCommit: "off", rowStatements: 3, want: 3},
		{name: "explicit setting wins under on", synchronousCommit: "on", rowStatements: 1, want: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := Config{SynchronousCommit: tt.synchronousCommit, RowStatements: tt.rowStatements}.WithDefaults()
			if cfg.RowStatements != tt.want {
				t.Errorf("RowStatements = %d, want %d", cfg.RowStatements, tt.want)
			}
			if err := cfg.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
		})
	}
}

// TestPoolSessionSettings: each pool's sessions carry the settings its
// statements were measured with (see New): custom plans that keep to their
// indexes on the work pool, cached generic plans on the tick pool, custom
// plans for River.
func TestPoolSessionSettings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	f, err := New(ctx, Config{DatabaseURL: db.URL, RiverSchema: testdb.RiverSchema, SynchronousCommit: "off"})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tests := []struct {
		pool    string
		setting string
		want    string
	}{
		{"work", "enable_seqscan", "off"},
		{"work", "plan_cache_mode", "force_custom_plan"},
		{"work", "synchronous_commit", "off"},
		{"tick", "plan_cache_mode", "force_generic_plan"},
		{"tick", "enable_seqscan", "on"},
		{"river", "plan_cache_mode", "force_custom_plan"},
		{"river", "enable_seqscan", "on"},
		{"work", "jit", "off"},
		{"tick", "jit", "off"},
		{"river", "jit", "off"},
	}
	pools := map[string]*pgxpool.Pool{"work": f.WorkPool, "tick": f.TickPool, "river": f.RiverPool}
	for _, tt := range tests {
		t.Run(tt.pool+"/"+tt.setting, func(t *testing.T) {
			var got string
			if err := pools[tt.pool].QueryRow(ctx, "SELECT current_setting($1)", tt.setting).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("%s = %q on the %s pool, want %q", tt.setting, got, tt.pool, tt.want)
			}
		})
	}
}

// TestServerWarnings: a fleet warns, once each, about a lock table below
// FlowFabric's recommendation and about autovacuum off, and says nothing of
// a healthy server. A regression lets a server with autovacuum off bloat
// river_job by every job ever run without a word, or nags a healthy one.
func TestServerWarnings(t *testing.T) {
	t.Parallel()
	healthy := store.ServerSettings{MaxLocksPerTransaction: 256, MaxConnections: 100, Autovacuum: true}
	tests := []struct {
		name string
		edit func(*store.ServerSettings)
		want []string // a word of each warning, in order
	}{
		{"Healthy", func(*store.ServerSettings) {}, nil},
		{"SmallLockTable", func(s *store.ServerSettings) { s.MaxLocksPerTransaction = 64 }, []string{"max_locks_per_transaction"}},
		{"AutovacuumOff", func(s *store.ServerSettings) { s.Autovacuum = false }, []string{"autovacuum is off"}},
		{"Both", func(s *store.ServerSettings) { s.MaxLocksPerTransaction, s.Autovacuum = 64, false },
			[]string{"max_locks_per_transaction", "autovacuum is off"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := healthy
			tt.edit(&s)
			got := serverWarnings(s)
			if len(got) != len(tt.want) {
				t.Fatalf("%d warnings %v; want %d", len(got), got, len(tt.want))
			}
			for i, w := range tt.want {
				if !strings.Contains(got[i].msg, w) {
					t.Errorf("warning %d %q; want it about %q", i, got[i].msg, w)
				}
			}
		})
	}
}

// TestConfigErrorsNameTheFlag: an unusable Config is refused with a
// *ConfigError naming the setting's flag (what a user of `worker run` gave)
// and its Config field (what a Go caller wrote); a regression shows as a
// loose phrase ("batch size") or a Go name in the error a user reads.
func TestConfigErrorsNameTheFlag(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		cfg   Config
		field string
		want  string
	}{
		{"BatchSize", Config{BatchSize: -1}, "BatchSize", "--batch-size -1: out of range 1..10000"},
		{"Lookahead", Config{Lookahead: time.Minute}, "Lookahead", "--lookahead 1m0s: too long (at most 5s)"},
		{"LookaheadOff", Config{Lookahead: -2}, "Lookahead", "--lookahead -2ns: negative (workers.Off, -1, turns it off)"},
		{"MetricsReadTimeout", Config{MetricsReadTimeout: -time.Second}, "MetricsReadTimeout", "--metrics-read-timeout -1s: negative"},
		{"CompletedJobRetention", Config{CompletedJobRetention: -1}, "CompletedJobRetention", "--completed-job-retention -1ns: negative"},
		{"RescueStuckJobsAfter", Config{RescueStuckJobsAfter: time.Second}, "RescueStuckJobsAfter", "must exceed the longest job timeout"},
		{"Interval", Config{Reconcilers: map[string]time.Duration{"lease_expiry": time.Millisecond}}, "Reconcilers[lease_expiry]",
			"--lease-expiry-interval 1ms: interval too short"},
		{"RetentionNeeded", Config{Reconcilers: map[string]time.Duration{"retention": time.Minute}}, "Reconcilers",
			"--reconcilers retention: runs only with --retention"},
		{"RetentionTooShort", Config{Settings: workers.Values{workers.RetentionAge: time.Millisecond}}, "Settings[retention]",
			"--retention 1ms: too short (minimum 1s)"},
		{"OutboxRetentionFiltered", Config{Settings: workers.Values{workers.OutboxAge: time.Hour}, Filter: store.Filter{Namespace: "acme"}},
			"Settings[outbox-retention]", "--outbox-retention 1h0m0s: cannot run in a fleet with a tenant filter (namespace acme)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.cfg.Validate()
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Field != tt.field || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate: %v; want a ConfigError of field %s containing %q", err, tt.field, tt.want)
			}
		})
	}
}

// notSettings are the Config fields that are not settings a user gives on
// the command line: what a Go caller wires in (pools' tracer, observers,
// extra workers, the logger, a test's signal or hold on River's insert
// notifications), and the set of reconcilers
// with their intervals, which `worker run` builds from --reconcilers and
// one --<name>-interval flag per reconciler.
var notSettings = map[string]bool{
	"Reconcilers": true, "Observer": true, "ExtraWorkers": true, "QueryTracer": true, "Logger": true, "Listening": true,
	"InsertNotifyCooldown": true,
}

// TestEverySettingHasItsFlag: every field of Config a user sets is one of
// Config.Flags, with a flag, help text and a default; every reconciler's
// setting is too; and no two share a flag. A regression is a setting only a
// Go caller can reach (MetricsReadTimeout once was), or a flag whose
// default --help cannot tell.
func TestEverySettingHasItsFlag(t *testing.T) {
	t.Parallel()
	var c Config
	flags := c.Flags()
	byField := map[string]Flag{}
	seen := map[string]bool{}
	for _, f := range flags {
		if seen[f.Flag] {
			t.Errorf("flag --%s declared twice", f.Flag)
		}
		seen[f.Flag] = true
		if f.Help == "" {
			t.Errorf("flag --%s has no help", f.Flag)
		}
		byField[strings.SplitN(f.Field, ".", 2)[0]] = f
	}
	typ := reflect.TypeOf(c)
	for i := range typ.NumField() {
		name := typ.Field(i).Name
		if notSettings[name] {
			continue
		}
		if _, ok := byField[name]; !ok && name != "Settings" {
			t.Errorf("Config.%s has no flag (Config.Flags)", name)
		}
	}
	for _, s := range workers.AllSettings() {
		if !seen[s.Flag] {
			t.Errorf("setting --%s of a reconciler has no flag", s.Flag)
		}
		if s.ShapeKey == "" {
			t.Errorf("setting --%s has no shape key: fleets of one River schema would not compare it", s.Flag)
		}
	}
	for _, r := range workers.All() {
		if seen[r.IntervalFlag()] {
			t.Errorf("--%s is both an interval and a setting", r.IntervalFlag())
		}
	}
}
