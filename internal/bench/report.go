package bench

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/flowfabric/ffreconcile/store"
)

// Report is a benchmark run's results.
type Report struct {
	Config     Config
	Command    string
	Machine    string
	Server     store.ServerSettings
	Started    time.Time
	Finished   time.Time
	Throughput []ThroughputResult
	// RiverCeiling is the rate of no-op River jobs enqueued and worked as
	// ours are, by synchronous_commit (riverCeiling).
	RiverCeiling map[string]float64
	// RiverCeilingCPU is what those jobs cost per job, as OursCPU is
	// measured.
	RiverCeilingCPU map[string]CPUCost
	// ShapedCeiling and ShapedCeilingCPU are the same for no-op jobs with
	// our row's args and job log (lease expiry's), by synchronous_commit.
	ShapedCeiling    map[string]float64
	ShapedCeilingCPU map[string]CPUCost
	// CeilingGIN is what the no-op row jobs grew river_job's GIN indexes
	// by, in a run of their own (see ginDirect).
	CeilingGIN ginSize
	Lateness   []LatenessResult
	// Promote is the promote section: enqueueing ad-hoc promotions
	// through the SQL function and through River's Go client.
	Promote    []EnqueueResult
	Failover   []FailoverResult
	Idle       IdleResult
	Scale      ScaleResult
	Retention  RetentionResult
	Dependency DependencyResult
	Flows      FlowsResult
	Backlog    BacklogResult
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "**missed**"
}

// Markdown renders the report for docs/benchmarks.md.
func (r *Report) Markdown() string {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	p("# Benchmarks")
	p("")
	// An incomplete run's report is written where it failed.
	finished := r.Finished
	if finished.IsZero() {
		finished = time.Now()
	}
	p("Produced by `%s` on %s (%s, %s).", r.Command, r.Started.UTC().Format("2006-01-02 15:04 MST"),
		r.Machine, finished.Sub(r.Started).Round(time.Second))
	p("The soak, 30 minutes of a mixed stream (`make soak`), is recorded in its own section, [Soak](#soak), at the end.")
	p("Every comparison is a ratio of rates measured in the same run on the same data; absolute numbers on a shared")
	p("2-core machine drift by ±25 %%. Postgres runs on the same machine as the worker. %s", ServerLine(r.Server))
	if len(r.Throughput) > 0 {
		p("")
		p("## Throughput")
		p("")
		p("Rows per second from the first tick to the last action committed; %d due rows over 256 partitions plus %d× as many",
			r.Throughput[0].Due, r.Config.NotDueFactor)
		p("not-due rows. (a) the seed's design: partitions one after another, one transaction per row (the seed's statements),")
		p("one connection. (b) the same per-row transaction on a pool (best of %v connections). (c) one statement per partition.", r.Config.PoolSizes)
		p("")
		p("Every design runs under the same `synchronous_commit` (on: each commit waits for the WAL flush; off: it does not),")
		p("and on warm connections, as a long-running process's are: before its window, each connection it uses has planned")
		p("over every partition of the reconciler's tables (a backend builds its cache of a partition and its indexes the first")
		p("time it plans against it), and ours has built the generic plans of its ticks' queries, as after its first ticks; the")
		p("CPU of that warm-up is not counted. Ours is the default fleet (every reconciler ticking, one reconciler's rows")
		p("due); \"alone\" is ours again with that reconciler alone in the fleet.")
		p("")
		if r.Config.OursOnly {
			// Tuning runs measure ours alone: no references, no ratios.
			p("Only ours was run (`--ours-only`): no reference designs, so no ratios or verdicts.")
		} else {
			p("| reconciler | synchronous_commit | ours | (a) seed loop | (b) per-row pool | (c) set-based | ours/(a) | ours/(b) | ours/(c) | ≥ 2×(a) | ≥ 0.6×(b) |")
			p("|---|---|---|---|---|---|---|---|---|---|---|")
			for _, t := range r.Throughput {
				p("| %s | %s | %.0f | %.0f | %.0f (%d conns) | %.0f | %.2f | %.2f | %.2f | %s | %s |", t.Reconciler, t.Commit, t.Ours, t.SeedLoop,
					t.Pool, t.PoolSize, t.SetBased, t.Ours/t.SeedLoop, t.Ours/t.Pool, t.Ours/t.SetBased,
					verdict(t.Ours >= 2*t.SeedLoop), verdict(t.Ours >= 0.6*t.Pool))
			}
			p("")
			p("CPU per row acted on, whole machine (the client, Postgres's backends and its background work; the benchmark's")
			p("own process in brackets). It drifts less than a rate on a shared machine and says what each design costs.")
			p("")
			p("| reconciler | synchronous_commit | ours | (a) seed loop | (b) per-row pool | (c) set-based |")
			p("|---|---|---|---|---|---|")
			for _, t := range r.Throughput {
				p("| %s | %s | %s | %s | %s | %s |", t.Reconciler, t.Commit, t.OursCPU, t.SeedCPU, t.PoolCPU, t.SetCPU)
			}
			p("")
			p("Ours with the reconciler alone in the fleet, against the default fleet's run above:")
		}
		p("")
		p("| reconciler | synchronous_commit | ours (default fleet) | CPU per row | alone | CPU per row |")
		p("|---|---|---|---|---|---|")
		for _, t := range r.Throughput {
			p("| %s | %s | %.0f | %s | %.0f | %s |", t.Reconciler, t.Commit, t.Ours, t.OursCPU, t.Alone, t.AloneCPU)
		}
		if len(r.RiverCeiling) > 0 {
			p("")
			p("River's own ceiling: the same number of row jobs that do nothing, enqueued as ours are (a scan job per")
			p("partition on `ff_control` inserting its rows in one transaction, unique among unfinished jobs) and worked by the")
			p("fleet's own River client (its queues, row workers, fetch cooldown, pools and wake-ups), from the scans' insert to")
			p("the last row job run. What ours loses against it is our own work: the tick, the scans' reads and the row")
			p("statements (`docs/performance.md`). Aim: ours at least 0.8 of it. \"Shaped\": the same no-op jobs with our")
			p("row's args (lease expiry's: an execution id no other job has) and our job log line, which")
			p("is River's share of what our row jobs cost beyond its no-op.")
			p("")
			p("| reconciler | synchronous_commit | ours | River no-op | ours / no-op | ≥ 0.8 | shaped no-op | shaped / no-op | ours / shaped |")
			p("|---|---|---|---|---|---|---|---|---|")
			for _, t := range r.Throughput {
				c, sh := r.RiverCeiling[t.Commit], r.ShapedCeiling[t.Commit]
				p("| %s | %s | %.0f | %.0f | %.2f | %s | %.0f | %.2f | %.2f |", t.Reconciler, t.Commit, t.Ours, c, t.Ours/c,
					verdict(t.Ours >= 0.8*c), sh, sh/c, t.Ours/sh)
			}
			p("")
			p("The same in CPU per row (whole machine, the benchmark's process in brackets): \"beyond River\" is ours less")
			p("the no-op, what a row of ours costs beyond River's own job, of which \"shaped\" less the no-op is River's")
			p("for our row's args and log; (c) is what the same actions cost as one set-based statement per partition.")
			p("")
			p("| reconciler | synchronous_commit | ours | River no-op | shaped no-op | beyond River | of it River's (shaped) | (c) set-based |")
			p("|---|---|---|---|---|---|---|---|")
			for _, t := range r.Throughput {
				cc, sc := r.RiverCeilingCPU[t.Commit], r.ShapedCeilingCPU[t.Commit]
				set := "–" // --ours-only
				if t.SetCPU.Machine > 0 {
					set = t.SetCPU.String()
				}
				p("| %s | %s | %s | %s | %s | %+d µs | %+d µs | %s |", t.Reconciler, t.Commit, t.OursCPU, cc, sc,
					(t.OursCPU.Machine - cc.Machine).Microseconds(), (sc.Machine - cc.Machine).Microseconds(), set)
			}
			p("")
			p("Against the floor of the shape, one River job per row action: River's no-op job plus the same action done")
			p("set-based, (c), in CPU per row. Aim: ours at no more than 1.33× the floor (at least 0.75 of its speed).")
			p("")
			p("| reconciler | synchronous_commit | ours | floor (no-op + set-based) | floor / ours | ≥ 0.75 |")
			p("|---|---|---|---|---|---|")
			for _, t := range r.Throughput {
				if t.SetCPU.Machine == 0 || t.OursCPU.Machine == 0 {
					continue // --ours-only: no set-based run
				}
				floor := r.RiverCeilingCPU[t.Commit].Machine + t.SetCPU.Machine
				ratio := float64(floor) / float64(t.OursCPU.Machine)
				p("| %s | %s | %d µs | %d µs | %.2f | %s |", t.Reconciler, t.Commit, t.OursCPU.Machine.Microseconds(),
					floor.Microseconds(), ratio, verdict(ratio >= 0.75))
			}
			p("")
			p("Who spent it, per row: the benchmark's process (the client: River's client and ours) and Postgres's")
			p("processes by the pool whose connection each backend serves: River's (fetches, completions), the work pool")
			p("(scans' reads and their inserts of row jobs, the row statements), the tick pool, the benchmark's (the no-op")
			p("runs' inserts of row jobs), and other processes (WAL writer, checkpointer, autovacuum).")
			p("")
			p("| run | synchronous_commit | machine | client | %s |", strings.Join(PostgresParts, " | "))
			p("|---|---|---|---|%s", strings.Repeat("---|", len(PostgresParts)))
			split := func(name, commit string, c CPUCost) {
				parts := make([]string, len(PostgresParts))
				for i, part := range PostgresParts {
					parts[i] = fmt.Sprintf("%d µs", c.Postgres[part].Microseconds())
				}
				p("| %s | %s | %d µs | %d µs | %s |", name, commit, c.Machine.Microseconds(), c.Self.Microseconds(), strings.Join(parts, " | "))
			}
			for _, mode := range r.Config.CommitModes {
				if c, ok := r.RiverCeilingCPU[mode]; ok {
					split("River no-op", mode, c)
					split("shaped no-op", mode, r.ShapedCeilingCPU[mode])
				}
			}
			for _, t := range r.Throughput {
				split("ours, "+t.Reconciler, t.Commit, t.OursCPU)
			}
		}
		if slices.ContainsFunc(r.Throughput, func(t ThroughputResult) bool { return t.OursNoLogs > 0 }) {
			p("")
			p("What each row job costs besides its action. The job log: ours run again on the same data without the per-job")
			p("log line River UI shows (`--no-job-logs`); River keeps that line in the job's metadata, written with its")
			p("completion. `river_job`'s GIN indexes (over args and metadata, River's own): what the same rows' jobs grew them")
			p("by, per million row jobs, in runs of their own where the indexes take each entry directly (fastupdate off; a")
			p("pending list is a constant 4 MB in production, while its high-water mark would dominate 20,000 jobs); River's")
			p("reindexer rebuilds them daily. A value jobs share costs a job a few bytes of a posting list, a value of its own")
			p("(an execution id, a deadline, a log line naming them) an index entry. Under the first commit mode only.")
			p("")
			p("| reconciler | synchronous_commit | ours | without job logs | job log: rate | job log: CPU per row | GIN per million: ours | without job logs | River no-op |")
			p("|---|---|---|---|---|---|---|---|---|")
			for _, t := range r.Throughput {
				if t.OursNoLogs == 0 {
					continue
				}
				p("| %s | %s | %.0f | %.0f | %+.0f %% | %+d µs | %s | %s | %s |", t.Reconciler, t.Commit, t.Ours, t.OursNoLogs,
					(t.Ours/t.OursNoLogs-1)*100, (t.OursCPU.Machine - t.NoLogsCPU.Machine).Microseconds(),
					t.OursGIN.perMillion(t.Due), t.NoLogsGIN.perMillion(t.Due), r.CeilingGIN.perMillion(t.Due))
			}
		}
		p("")
		for _, t := range r.Throughput {
			p("- %s (synchronous_commit %s), ours: %s", t.Reconciler, t.Commit, t.OursStats)
		}
	}
	if len(r.Lateness) > 0 {
		p("")
		p("## Lateness")
		p("")
		p("A steady stream of rows becoming due (%d per second for %s); per row, the time from its deadline to the commit", r.Config.LatenessRate, r.Config.LatenessFor)
		p("of its action. Lead is how long before its deadline each row was inserted: with a lead shorter than the tick")
		p("interval, rows appearing after a tick and due before the next are found only once due; with a lead longer than")
		p("interval + lookahead every row exists before the tick ahead of its deadline (a lease renewed every few seconds,")
		p("a timeout in minutes) and is enqueued to start at it. Targets: p99 ≤ tick interval + 0.5 s, max ≤ 2 × interval.")
		p("")
		p("| stream | lead | tick interval | rows | p50 | p99 | max | p99 target | max target |")
		p("|---|---|---|---|---|---|---|---|---|")
		for _, l := range r.Lateness {
			p("| %s | %s | %s | %d | %s | %s | %s | %s | %s |", l.Name, l.Lead, l.Interval, l.Rows,
				l.P50.Round(time.Millisecond), l.P99.Round(time.Millisecond), l.Max.Round(time.Millisecond),
				verdict(l.P99 <= l.Interval+500*time.Millisecond), verdict(l.Max <= 2*l.Interval))
		}
		p("")
		for _, l := range r.Lateness {
			p("- %s, lead %s, ours: CPU per row %s (feeder included); %s", l.Name, l.Lead, l.CPU, l.Stats)
		}
		p("")
		p("Where the time goes, from River's timestamps of the same runs' jobs: queue wait is scheduled_at → attempted_at")
		p("(for a row job enqueued ahead, scheduled_at is its deadline + 1 ms, so this is its start's delay), run is")
		p("attempted_at → finalized_at (River's batch completer finalizes row jobs a little after their commit), deadline →")
		p("enqueued is the tick's wait plus the fan-out and the scan (negative: enqueued ahead), fan-out → last scan started")
		p("is per tick (jobs = ticks) how long its burst of partition scans took to start.")
		p("")
		p("| stream | lead | job kind | step | jobs | p50 | p99 |")
		p("|---|---|---|---|---|---|---|")
		for _, l := range r.Lateness {
			for _, st := range l.Stages {
				p("| %s | %s | %s | %s | %d | %s | %s |", l.Name, l.Lead, st.Kind, st.Step, st.Jobs, st.P50.Round(time.Millisecond), st.P99.Round(time.Millisecond))
			}
		}
	}
	if len(r.Promote) > 0 {
		p("")
		p("## Promotions from other languages")
		p("")
		p("Ad-hoc promotions enqueued one per transaction (begin, the insert, commit) from %d connections for %s each, no fleet",
			r.Promote[0].Conns, r.Config.PromoteFor)
		p("running: through the SQL function `river.ffreconcile_promote` (what a service in another language calls) and through")
		p("River's Go client (`InsertTx` of `jobs.PromoteArgs` on an insert-only client). Without `at` the job is available and")
		p("the insert sends River's notification; with `at` an hour ahead it is scheduled. Lateness from `at` to the promotion,")
		p("for both, is in the Lateness section's ad-hoc streams.")
		p("")
		p("| via | at | promotions/s | transaction p50 | transaction p99 | promotions |")
		p("|---|---|---|---|---|---|")
		for _, x := range r.Promote {
			p("| %s | %s | %.0f | %s | %s | %d |", x.Via, x.At, x.PerSec, x.P50, x.P99, x.Promotions)
		}
	}
	if len(r.Failover) > 0 {
		p("")
		p("## Leader failover")
		p("")
		p("The lease expiry stream above (%d rows/s for %s, every reconciler but attempt timeout) into a fleet of %d real",
			r.Config.LatenessRate, r.Config.LatenessFor, r.Failover[0].Processes)
		p("`worker run` processes; the leader is ended and not restarted: SIGKILLed a third into the stream (whatever it is")
		p("doing: often between two bursts, holding no job) or at the first moment after that when it runs release jobs, or")
		p("stopped cleanly (SIGTERM) a third in. Takeover and handoff: the fleet's default, where the survivors' heartbeat")
		p("(every 5 s) finds a dead process without a connection, resigns its leadership, rescues its running jobs and starts")
		p("the ticks at once, and a leader stopping cleanly starts the ticks for its successor as it resigns")
		p("(docs/design.md, \"Leader failover\"); without them (`--no-takeover`), River alone: its leadership TTL, its rescuer,")
		p("and its new leader's periodic jobs, which start 0-6 s after the election. Lateness per row from its deadline to its")
		p("release, over all rows and over those due from the kill to the stream's end; times after the kill by the")
		p("database's clock: the new leader's election, the first tick inserted since (by the takeover, the handoff or the new")
		p("leader), and the end of the last job the killed process had left running (run again elsewhere).")
		p("")
		p("| leader ended by | takeover and handoff | lead | rows | p50 | p99 | max | due after the kill: rows | p99 | max | new leader elected | first tick | jobs the killed process left running: done | before the dead term expired |")
		p("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
		for _, f := range r.Failover {
			on := "off (River alone)"
			if f.Takeover {
				on = "on"
			}
			left := "none"
			if f.KilledJobs > 0 {
				left = fmt.Sprintf("%d: %s", f.KilledJobs, f.LastOfKilled.Round(time.Millisecond))
			}
			p("| %s | %s | %s | %d | %s | %s | %s | %d | %s | %s | %s | %s | %s | %s |", f.Kill, on, f.Lead, f.Rows,
				f.P50.Round(time.Millisecond), f.P99.Round(time.Millisecond), f.Max.Round(time.Millisecond), f.AfterRows,
				f.AfterP99.Round(time.Millisecond), f.AfterMax.Round(time.Millisecond), f.Elected.Round(time.Millisecond),
				f.FirstTick.Round(time.Millisecond), left, yesNo(f.ElectedBeforeExpiry))
		}
	}
	if r.Idle.Window > 0 {
		i := r.Idle
		p("")
		p("## Idle cost")
		p("")
		p("Nothing due, %d not-due rows, measured over %s per side. Statements are counted by the client (a pgx tracer", i.NotDueRows, i.Window)
		p("on every pool); CPU is the user+system time of the Postgres backends serving the process, read from /proc;")
		p("transactions are `pg_stat_database.xact_commit`. Two comparisons, in the same run: the seed's reconcilers (lease")
		p("expiry, suspension timeout, delayed promotion and the cancel pair) against the seed's loops for them (delayed")
		p("promotion has none on Postgres); and every reconciler (the default fleet; retention aside, off without a")
		p("retention) against FlowFabric's whole Postgres scanner supervisor, its eight loops at their defaults: lease")
		p("expiry (1.5 s), attempt timeout (2 s) and suspension timeout (2 s) scan all 256 partitions every tick, budget")
		p("reset its 32 budget partitions (15 s), the worker-registry sweep runs one DELETE per registry partition (30 s),")
		p("the cancel dispatcher (1 s), its reconciler (10 s) and the dependency reconciler (15 s) one query each.")
		p("")
		p("| reconcilers | side | statements/s | Postgres CPU (%% of a core) | transactions/s |")
		p("|---|---|---|---|---|")
		for _, run := range i.Runs {
			o, s := run.Ours, run.Seed
			p("| %s | ours | %.1f | %.2f | %.1f |", run.Set, o.StatementsPerSec, o.BackendCPUPct, o.XactPerSec)
			p("| %s | seed loops | %.1f | %.2f | %.1f |", run.Set, s.StatementsPerSec, s.BackendCPUPct, s.XactPerSec)
			p("| %s | ours / seed | %.3f | %.3f | %.3f |", run.Set, o.StatementsPerSec/s.StatementsPerSec,
				o.BackendCPUPct/s.BackendCPUPct, o.XactPerSec/s.XactPerSec)
		}
		p("")
		for _, run := range i.Runs {
			p("Target ≤ 5 %% of the seed's statements per second, %s: %s.", run.Set,
				verdict(run.Ours.StatementsPerSec <= 0.05*run.Seed.StatementsPerSec))
		}
	}
	if r.Scale.SmallRows > 0 {
		s := r.Scale
		p("")
		p("## Scale")
		p("")
		p("A lease expiry tick with one due row in each partition, against each table, the two taking turns (median of %d", tickRounds)
		p("each): from the tick's start to its fan-out as the worker runs it (its due-partitions queries, its checks of")
		p("River's queue for busy partitions and the insert of 256 partition scans: `workers.Set.Tick`), and the")
		p("due-partitions query alone. River's fetch of the tick job, the same for both, is not included.")
		p("")
		p("| not-due rows | tick to fan-out | due-partitions query alone |")
		p("|---|---|---|")
		p("| %d | %s | %s |", s.SmallRows, s.SmallFanOut.Round(10*time.Microsecond), s.SmallTick.Round(10*time.Microsecond))
		p("| %d | %s | %s |", s.LargeRows, s.LargeFanOut.Round(10*time.Microsecond), s.LargeTick.Round(10*time.Microsecond))
		p("")
		p("Ratio %.2f (target ≤ 1.5): %s. The due-partitions query alone: %.2f (see docs/performance.md, \"The scale",
			float64(s.LargeFanOut)/float64(s.SmallFanOut), verdict(float64(s.LargeFanOut) <= 1.5*float64(s.SmallFanOut)),
			float64(s.LargeTick)/float64(s.SmallTick))
		p("target: a tick, from its start to its fan-out\").")
		p("")
		p("Plan of the tick's query with %d not-due rows (each partition's probe is a run-time-pruned index scan):", s.LargeRows)
		p("")
		p("```\n%s\n```", s.LargePlan)
		p("")
		p("Plan of one partition scan:")
		p("")
		p("```\n%s\n```", s.ScanPlan)
		p("")
		p("Backlog: %d expired leases drained in %s (%.0f rows/s). %s", s.Backlog, s.BacklogDrain.Round(time.Millisecond), s.BacklogRate, s.BacklogStats)
	}
	if d := r.Dependency; d.Events > 0 {
		p("")
		p("## Dependency")
		p("")
		p("%d undispatched completion events committed an hour ago, each of an upstream with 1-3 edges (%d in all) to", d.Events, d.Edges)
		p("downstreams blocked on an all_of group of that upstream, over every partition, beside %d dispatched ones. (a)",
			d.Events*r.Config.NotDueFactor)
		p("FlowFabric's `reconcile_tick` and `dispatch_completion` as written: a global scan of 1,000 events, then each event")
		p("claimed (autocommit) and each hop in a SERIALIZABLE transaction of its own, one event after another on one")
		p("connection. (b) ours: one fleet process with every reconciler on, first tick to last dispatch. (c) set-based: one")
		p("statement per partition claiming its events and advancing their all_of groups (this data's shape only).")
		p("")
		p("| | events/s | machine CPU per event | ours / it |")
		p("|---|---|---|---|")
		p("| ours | %.0f | %s | |", d.Ours, d.OursCPU.Machine)
		if d.FFLoop > 0 {
			p("| FlowFabric's loop | %.0f | %s | %.2f |", d.FFLoop, d.FFCPU.Machine, d.Ours/d.FFLoop)
		} else {
			p("| FlowFabric's loop | not run (--ours-only) | | |")
		}
		p("| set-based | %.0f | %s | %.2f |", d.SetBased, d.SetCPU.Machine, d.Ours/d.SetBased)
		p("")
		p("Ours: %s.", d.OursStats)
		p("")
		parts := make([]string, len(PostgresParts))
		for i, part := range PostgresParts {
			parts[i] = fmt.Sprintf("%s %d µs", part, d.OursCPU.Postgres[part].Microseconds())
		}
		p("Ours' machine CPU per event by who spent it: the benchmark's process (River's client and ours) %d µs; Postgres's",
			d.OursCPU.Self.Microseconds())
		p("processes by pool: %s.", strings.Join(parts, ", "))
		p("")
		p("A chain of %d downstreams made impossible one after another by a failed upstream (all_of, one upstream each),", d.ChainHops)
		p("from the first event's dispatch to the last skip event's: ours (default interval and threshold, 15 s) %s;",
			d.ChainOurs.Round(time.Millisecond))
		p("FlowFabric's loop at a %s interval and a %s threshold (its module's test value; its supervisor runs 15 s and 15 s,", d.ChainFFInterval, d.ChainFFInterval)
		p("so about 15 times this) %s.", d.ChainFF.Round(time.Millisecond))
		p("")
		p("Primary dispatch (`--dependency-stale-threshold 0`): %d events (one edge each) fed at %d/s for %s into one fleet process",
			d.PrimaryEvents, d.PrimaryRate, r.Config.LatenessFor)
		p("running the dependency reconciler alone, its connections warmed first")
		p("(server: %s),", d.PrimaryServer)
		p("each event's `dispatched_at_ms − committed_at_ms`: p50 %s, p99 %s (target ≤ 250ms at 1,000/s: %s), max %s. %s.",
			d.PrimaryP50, d.PrimaryP99, verdict(d.PrimaryP99 <= 250*time.Millisecond && d.PrimaryRate >= 1000), d.PrimaryMax, d.PrimaryStats)
		for i, part := range PostgresParts {
			parts[i] = fmt.Sprintf("%s %d µs", part, d.PrimaryCPU.Postgres[part].Microseconds())
		}
		p("Machine CPU per event, feed to drain: %s; the benchmark's process (the fleet, and the feed's client) %d µs;",
			d.PrimaryCPU.Machine, d.PrimaryCPU.Self.Microseconds())
		p("Postgres's processes by pool (the feed's inserts are the bench pool's): %s.", strings.Join(parts, ", "))
		if len(d.PrimaryStages) > 0 {
			p("")
			p("Where an event's time goes, by the dispatch job that claimed it: commit → enqueued is FlowFabric's notification,")
			p("the listener's lookup and its insert; queue wait is River's (created → attempted); attempted → claimed is the")
			p("job's wait for a dispatch transaction (the claim writes the time its transaction starts).")
			p("")
			p("| step | events | p50 | p99 |")
			p("|---|---|---|---|")
			for _, st := range d.PrimaryStages {
				p("| %s | %d | %s | %s |", st.Step, st.Jobs, st.P50.Round(time.Millisecond), st.P99.Round(time.Millisecond))
			}
		}
	}
	if fl := r.Flows; fl.Flows > 0 {
		p("")
		p("## Flow summaries")
		p("")
		p("%d finished flows of FlowFabric's layout (`ff_flow_core`), three members each (%d executions, ended an hour ago,", fl.Flows, fl.Members)
		p("one flow in ten failed), over every partition. A fleet running `flow_summary` alone, from its start to the last")
		p("summary written: its first pass, the backfill of a fleet started on an existing database (each partition's job")
		p("reads the members ended after its mark, a batch of flows per statement). Every summary is checked against its")
		p("members.")
		p("")
		p("| flows | time | flows/s | machine CPU per flow |")
		p("|---|---|---|---|")
		p("| %d | %s | %.0f | %s |", fl.Flows, fl.ProjectTime.Round(time.Millisecond), float64(fl.Flows)/fl.ProjectTime.Seconds(), fl.ProjectCPU.Machine)
		p("")
		p("Ours: %s.", fl.Stats)
		p("")
		p("The default fleet idle (%s, measured as in \"Idle cost\"), on an empty database and beside the %d projected", r.Config.IdleFor, fl.Flows)
		p("flows: a finished flow is never read again, so the two should match.")
		p("")
		p("| database | statements/s | Postgres CPU (%% of a core) | transactions/s |")
		p("|---|---|---|---|")
		p("| empty | %.1f | %.2f | %.1f |", fl.IdleEmpty.StatementsPerSec, fl.IdleEmpty.BackendCPUPct, fl.IdleEmpty.XactPerSec)
		p("| %d finished flows | %.1f | %.2f | %.1f |", fl.Flows, fl.IdleFinished.StatementsPerSec, fl.IdleFinished.BackendCPUPct, fl.IdleFinished.XactPerSec)
		p("")
		p("Target: the finished flows add nothing to the idle statements (within 10 %%): %s.",
			verdict(fl.IdleFinished.StatementsPerSec <= 1.1*fl.IdleEmpty.StatementsPerSec))
	}
	if b := r.Backlog; b.Members > 0 {
		p("")
		p("## Cancel backlog")
		p("")
		p("%d flows cancelled an hour ago whose server never acked their members: each a cancel backlog header (grace", b.Headers)
		p("unset, as FlowFabric's header leaves it) and %d member rows of live executions (%d members). (a) FlowFabric's", membersPerFlow, b.Members)
		p("statements as its Valkey cancel reconciler runs them (it has none on Postgres): one connection, header after")
		p("header, each member cancelled by the operator cancel (`cancel_execution_once`, SERIALIZABLE) then acked")
		p("(`ack_cancel_member`). (b) ours: a fleet running `cancel_backlog` alone, from its start to the last backlog row")
		p("deleted (a row job per header: its members locked, cancelled and acked in one transaction). Both are checked to")
		p("leave no backlog row and every member cancelled by the operator with the header's reason.")
		p("")
		p("| | time | members/s | machine CPU per member |")
		p("|---|---|---|---|")
		p("| FlowFabric's loop | %s | %.0f | %s |", b.FFTime.Round(time.Millisecond), float64(b.Members)/b.FFTime.Seconds(), b.FFCPU.Machine)
		p("| ours | %s | %.0f | %s |", b.OursTime.Round(time.Millisecond), float64(b.Members)/b.OursTime.Seconds(), b.OursCPU.Machine)
		p("| ours / FlowFabric | | %.2f | |", b.FFTime.Seconds()/b.OursTime.Seconds())
		p("")
		p("Ours: %s.", b.OursStats)
	}
	if t := r.Retention; t.Backlog > 0 {
		p("")
		p("## Retention")
		p("")
		p("%d terminal executions that ended two hours ago, each with an attempt, a dispatched completion event and two lease", t.Backlog)
		p("events (%d sibling rows), beside %d that must stay (ended a minute ago, or running), retention one hour. (a)", t.SiblingRows, t.Kept)
		p("FlowFabric's `trim_retention_impl` as written (one transaction per batch of %d: select, a DELETE per sibling table,", 1000)
		p("then the executions), partitions one after another on one connection, as its scanner loops. (b) ours: a fleet running")
		p("retention alone, from its start to the last execution deleted (one trim job per partition on its own queue, one")
		p("statement per batch). Both are checked to leave the %d executions that must stay and no sibling row of a trimmed one.", t.Kept)
		p("")
		p("| | time | executions/s | rows/s (with siblings) |")
		p("|---|---|---|---|")
		rate := func(d time.Duration) (float64, float64) {
			return float64(t.Backlog) / d.Seconds(), float64(t.Backlog+t.SiblingRows) / d.Seconds()
		}
		se, sr := rate(t.SeedTime)
		oe, or := rate(t.OursTime)
		p("| FlowFabric's trim | %s | %.0f | %.0f |", t.SeedTime.Round(time.Millisecond), se, sr)
		p("| ours | %s | %.0f | %.0f |", t.OursTime.Round(time.Millisecond), oe, or)
		p("| ours / FlowFabric | | %.2f | |", oe/se)
		p("")
		p("Ours: CPU per execution %s; %s.", t.OursCPU, t.OursStats)
		p("")
		d := t.During
		p("While the same backlog is trimmed, lease expiry's lateness under the Lateness section's lease stream (%d rows/s",
			d.Rate)
		p("for %s, each inserted %s before its deadline, every reconciler but attempt timeout running, retention added; an",
			r.Config.LatenessFor, d.Lead)
		p("expired lease of an active execution is due for attempt timeout too, which would give every row two racing row")
		p("jobs): p50 %s, p99 %s, max %s over %d rows.", d.P50.Round(time.Millisecond), d.P99.Round(time.Millisecond), d.Max.Round(time.Millisecond), d.Rows)
		for _, l := range r.Lateness {
			if l.Name == leaseLateness.name && l.Lead == d.Lead {
				p("Without the backlog (Lateness section): p50 %s, p99 %s, max %s.", l.P50.Round(time.Millisecond), l.P99.Round(time.Millisecond), l.Max.Round(time.Millisecond))
			}
		}
		p("%d of the backlog's executions were left when the stream ended. Target: lease expiry's lateness targets (p99 ≤", t.LeftAfterStream)
		p("interval + 0.5 s, max ≤ 2 × interval, interval %s): %s, %s.", d.Interval,
			verdict(d.P99 <= d.Interval+500*time.Millisecond), verdict(d.Max <= 2*d.Interval))
		p("")
		p("- %s: CPU per row %s (feeder included); %s", d.Name, d.CPU, d.Stats)
	}
	return b.String()
}
