package fleet

import (
	"fmt"
	"strings"
	"time"

	"github.com/riverqueue/river"

	"github.com/flowfabric/ffreconcile/internal/dbconn"
	"github.com/flowfabric/ffreconcile/internal/metrics"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/migrations"
	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

// Flag is one setting of a Config with the `worker run` flag that sets
// it, declared once (Config.Flags): cmd/worker defines its flags from
// them, WithDefaults applies their defaults, Validate checks each, and a
// ConfigError names the flag. Values follow River's convention: zero takes
// the default, and a setting that can be off is off at workers.Off (0 on
// the command line, where zero means off since an unset flag is the
// default).
type Flag struct {
	// Flag is the flag's name; Field the Config field, for Go callers.
	Flag, Field string
	// Help says what it does; Default what an unset setting takes.
	Help, Default string
	// Value is what the flag sets, pointing into the Config: *int,
	// *string, *bool, *time.Duration, or a flag.Value.
	Value any
	// CanBeOff: workers.Off (a duration) or -1 (a count) turns it off; 0
	// on the command line.
	CanBeOff bool
	// Secret: the value is never printed.
	Secret bool
	// OfReconciler: a reconciler's own setting (Config.Settings).
	OfReconciler bool

	setDefault func()
	problem    func() string
	shown      func() string
}

// Flags returns c's settings with their flags, each pointing into c: the fleet's own,
// then every reconciler's (workers.AllSettings). The reconcilers' intervals
// and the set of reconcilers run (Reconcilers) are not among them: they are
// one map, set by `worker run`'s --reconcilers and --<name>-interval flags.
func (c *Config) Flags() []Flag {
	intRange := func(field, flag string, p *int, def, lo, hi int, help string) Flag {
		return Flag{Flag: flag, Field: field, Help: help, Default: fmt.Sprint(def), Value: p,
			setDefault: func() {
				if *p == 0 {
					*p = def
				}
			},
			problem: func() string {
				if *p < lo || *p > hi {
					return fmt.Sprintf("out of range %d..%d", lo, hi)
				}
				return ""
			},
			shown: func() string { return fmt.Sprint(*p) }}
	}
	duration := func(field, flag string, p *time.Duration, def time.Duration, help string, check func(time.Duration) string) Flag {
		return Flag{Flag: flag, Field: field, Help: help, Default: def.String(), Value: p,
			setDefault: func() {
				if *p == 0 {
					*p = def
				}
			},
			problem: func() string {
				if check != nil {
					return check(*p)
				}
				return ""
			},
			shown: func() string { return p.String() }}
	}
	atLeast := func(lo time.Duration) func(time.Duration) string {
		return func(d time.Duration) string {
			if d < lo {
				return fmt.Sprintf("too short (minimum %s)", lo)
			}
			return ""
		}
	}
	commitLevel := func(field, flag string, p *string, def, help string) Flag {
		return Flag{Flag: flag, Field: field, Help: help, Default: def, Value: p,
			setDefault: func() {
				if *p == "" {
					*p = def
				}
			},
			problem: func() string {
				switch *p {
				case "on", "off", "local", "remote_write", "remote_apply":
					return ""
				}
				return "want on, off, local, remote_write or remote_apply"
			},
			shown: func() string { return fmt.Sprintf("%q", *p) }}
	}
	plain := func(field, flag string, p any, help string) Flag {
		return Flag{Flag: flag, Field: field, Help: help, Value: p}
	}

	out := []Flag{
		{Flag: "database-url", Field: "DatabaseURL", Value: &c.DatabaseURL, Secret: true,
			Help:    "PostgreSQL connection string (URL or key=value); its password is never logged",
			Default: dbconn.DefaultURL,
			setDefault: func() {
				if c.DatabaseURL == "" {
					c.DatabaseURL = dbconn.DefaultURL
				}
			},
			problem: func() string {
				if err := dbconn.Validate(c.DatabaseURL); err != nil {
					return err.Error()
				}
				return ""
			},
			shown: func() string { return dbconn.Redact(c.DatabaseURL) }},
		{Flag: "river-schema", Field: "RiverSchema", Value: &c.RiverSchema, Help: "Postgres schema holding River's tables",
			Default: jobs.DefaultRiverSchema,
			setDefault: func() {
				if c.RiverSchema == "" {
					c.RiverSchema = jobs.DefaultRiverSchema
				}
			},
			problem: func() string {
				if err := migrations.ValidateSchemaName(c.RiverSchema); err != nil {
					return err.Error()
				}
				return ""
			},
			shown: func() string { return fmt.Sprintf("%q", c.RiverSchema) }},
		intRange("BatchSize", "batch-size", &c.BatchSize, workers.DefaultBatchSize, 1, 10000,
			"most due rows one partition scan enqueues (a full batch continues itself)"),
		intRange("PartitionCount", "partition-count", &c.PartitionCount, jobs.PartitionCount, 1, jobs.PartitionCount,
			"flow partitions to scan, 0..N-1 (FlowFabric's num_flow_partitions)"),
		intRange("BudgetPartitionCount", "budget-partition-count", &c.BudgetPartitionCount, workers.DefaultBudgetPartitionCount, 1, jobs.PartitionCount,
			"budget and quota partitions their reconcilers walk, 0..N-1 (FlowFabric's num_budget_partitions and num_quota_partitions)"),
		{Flag: "namespace", Field: "Filter.Namespace", Value: &c.Filter.Namespace,
			Help: "only reconcile executions of this namespace (raw_fields.namespace)"},
		{Flag: "instance-tag", Field: "Filter.TagKey", Value: (*instanceTag)(&c.Filter),
			Help: "only reconcile executions whose raw_fields.tags KEY is the string VALUE (a number or boolean tag never matches, " +
				"as in FlowFabric), given as KEY=VALUE",
			problem: func() string {
				if c.Filter.TagKey == "" && c.Filter.TagValue != "" {
					return "a tag value without a key"
				}
				return ""
			},
			shown: func() string { return c.Filter.TagKey + "=" + c.Filter.TagValue }},
		intRange("RowWorkers", "row-workers", &c.RowWorkers, DefaultRowWorkers, 1, 10000,
			"row jobs River runs at once by this process (most wait for their row's statement)"),
		intRange("WorkConns", "work-conns", &c.WorkConns, DefaultWorkConns, 2, 1000, "connections for row statements, scans and ticks"),
		{Flag: "dispatch-lanes", Field: "DispatchLanes", Value: &c.DispatchLanes, Default: fmt.Sprint(DefaultDispatchLanes),
			Help: "connections of the dependency reconciler's single-event dispatches, each with the generic plans of its share of the " +
				"partitions (about 5 MB a lane with 8; 0: none, every dispatch on the work pool with custom plans)",
			CanBeOff: true,
			setDefault: func() {
				if c.DispatchLanes == 0 {
					c.DispatchLanes = DefaultDispatchLanes
				}
			},
			problem: func() string {
				if c.DispatchLanes != -1 && (c.DispatchLanes < 1 || c.DispatchLanes > 64) {
					return "out of range 1..64 (0 on the command line, -1 in fleet.Config: none)"
				}
				return ""
			},
			shown: func() string {
				if c.DispatchLanes == -1 {
					return "off"
				}
				return fmt.Sprint(c.DispatchLanes)
			}},
		intRange("RowBatch", "row-batch", &c.RowBatch, workers.DefaultRowBatch, 1, 1000,
			"most row actions of one partition sharing one statement (1: one statement per row)"),
		commitLevel("SynchronousCommit", "synchronous-commit", &c.SynchronousCommit, "on",
			"synchronous_commit of the reconcilers' own transactions (on, off, …); off trades crash durability for throughput (see docs/design.md)"),
	}
	rowStatements := intRange("RowStatements", "row-statements", &c.RowStatements, workers.DefaultRowStatements, 1, 1000,
		"most row-action statements of one reconciler in flight at once")
	rowStatements.Default = fmt.Sprintf("%d, or 1 with --synchronous-commit off", workers.DefaultRowStatements)
	rowStatements.setDefault = func() {
		if c.RowStatements == 0 {
			c.RowStatements = workers.DefaultRowStatements
			if c.SynchronousCommit == "off" {
				c.RowStatements = 1
			}
		}
	}
	lookahead := duration("Lookahead", "lookahead", &c.Lookahead, DefaultLookahead,
		"deadline reconcilers enqueue rows falling due before their next tick plus this at once, to start at the deadline (0: only rows already due)",
		func(d time.Duration) string {
			if d > jobs.RiverSchedulerInterval {
				return fmt.Sprintf("too long (at most %s)", jobs.RiverSchedulerInterval)
			}
			return ""
		})
	lookahead.CanBeOff = true
	reindex := duration("ReindexInterval", "river-reindex-interval", &c.ReindexInterval, 0,
		"how often River rebuilds river_job's indexes, whose GIN indexes grow with every job inserted", atLeast(time.Second))
	reindex.Default = "River's, daily at midnight UTC"
	reindex.setDefault = func() {} // zero is River's own schedule
	reindex.problem = func() string {
		if c.ReindexInterval != 0 && c.ReindexInterval < time.Second {
			return "too short (minimum 1s)"
		}
		return ""
	}
	out = append(out,
		rowStatements,
		commitLevel("RiverSynchronousCommit", "river-synchronous-commit", &c.RiverSynchronousCommit, "off",
			"synchronous_commit of River's own bookkeeping (job fetch, completion, leadership): a state lost in a crash only re-runs a job"),
		duration("RowFetchCooldown", "row-fetch-cooldown", &c.RowFetchCooldown, DefaultRowFetchCooldown,
			"least time between two fetches of row jobs", atLeast(river.FetchCooldownMin)),
		duration("FetchPollInterval", "fetch-poll-interval", &c.FetchPollInterval, DefaultFetchPollInterval,
			"how often idle queues poll (the ticks', scans' and trims' queues every 5 s at most); jobs waiting for their time are woken by the "+
				"fleet itself, except with --poll-only",
			func(d time.Duration) string {
				if d < river.FetchPollIntervalMin || d < c.RowFetchCooldown {
					return fmt.Sprintf("must be at least %s and at least the row fetch cooldown (%s)", river.FetchPollIntervalMin, c.RowFetchCooldown)
				}
				return ""
			}),
		lookahead,
		duration("CompletedJobRetention", "completed-job-retention", &c.CompletedJobRetention, DefaultCompletedJobRetention,
			"how long completed jobs are kept for River UI", atLeast(time.Second)),
		reindex,
		duration("RescueStuckJobsAfter", "rescue-stuck-jobs-after", &c.RescueStuckJobsAfter, DefaultRescueStuckJobsAfter,
			"retry a job left running by a dead process after this",
			func(d time.Duration) string {
				if d <= workers.ScanTimeout {
					return fmt.Sprintf("must exceed the longest job timeout (%s)", workers.ScanTimeout)
				}
				return ""
			}),
		duration("MetricsReadTimeout", "metrics-read-timeout", &c.MetricsReadTimeout, metrics.DefaultReadTimeout,
			"most time /metrics spends reading the due-row gauges from the database (a slower read serves the last values)", atLeast(time.Millisecond)),
		plain("ClientID", "client-id", &c.ClientID, "name of this process in River (default: derived from the host name)"),
		plain("Tracing", "otel", &c.Tracing, "OpenTelemetry spans for River jobs and SQL, exported as the standard OTEL_* variables say (OTLP by default)"),
		plain("DisableJobLogs", "no-job-logs", &c.DisableJobLogs, "do not keep a per-job log line (shown in River UI) for row actions"),
		plain("PollOnly", "poll-only", &c.PollOnly, "poll instead of LISTEN/NOTIFY (behind a transaction-mode pooler)"),
		plain("DisableTakeover", "no-takeover", &c.DisableTakeover,
			"do not take over the leadership and running jobs of a fleet process that died without a clean stop (no connection of it left), "+
				"nor start the ticks when a leadership changes hands; leave them to River's leadership TTL (15-21 s), rescuer "+
				"(--rescue-stuck-jobs-after, then up to 30 s) and new leader (its periodic jobs start 0-6 s after its election)"),
	)
	for _, s := range workers.AllSettings() {
		out = append(out, Flag{Flag: s.Flag, Field: "Settings[" + s.Flag + "]", Help: s.Help, Default: s.DefaultText(),
			Value: settingValue{c, s}, CanBeOff: s.CanBeOff, OfReconciler: true,
			problem: func() string { return s.Validate(c.Settings[s]) },
			shown:   func() string { return c.Settings[s].String() }})
	}
	return out
}

// settingValue is a reconciler's setting in a Config, as a flag.Value.
type settingValue struct {
	c *Config
	s *workers.Setting
}

func (v settingValue) String() string {
	if v.c == nil {
		return ""
	}
	return v.c.Settings[v.s].String()
}

func (v settingValue) Set(text string) error {
	d, err := time.ParseDuration(strings.TrimSpace(text))
	if err != nil {
		return fmt.Errorf("%q is not a duration (examples: 500ms, 1.5s, 24h)", text)
	}
	v.SetDuration(d)
	return nil
}

// SetDuration sets the setting to d.
func (v settingValue) SetDuration(d time.Duration) {
	if v.c.Settings == nil {
		v.c.Settings = workers.Values{}
	}
	v.c.Settings[v.s] = d
}

// instanceTag is the tenant filter's tag, set as KEY=VALUE.
type instanceTag store.Filter

func (t *instanceTag) String() string {
	if t == nil || t.TagKey == "" {
		return ""
	}
	return t.TagKey + "=" + t.TagValue
}

func (t *instanceTag) Set(text string) error {
	if text == "" {
		t.TagKey, t.TagValue = "", "" // none
		return nil
	}
	k, v, err := store.ParseInstanceTag(text)
	if err != nil {
		return err
	}
	t.TagKey, t.TagValue = k, v
	return nil
}

// ConfigError is an unusable setting of a Config: the flag that sets it
// (and the Config field, for a Go caller), its value and what is wrong
// with it and what is accepted.
type ConfigError struct {
	Flag, Field, Value, Problem string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("--%s %s: %s", e.Flag, e.Value, e.Problem)
}
