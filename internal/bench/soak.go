package bench

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/flowfabric/ffreconcile/internal/demo"
	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

// SoakWindow is one window of a soak run.
type SoakWindow struct {
	End           time.Duration // since the start
	Rows          int           // row samples of lateness (applied row actions)
	P50, P99, Max time.Duration
	// ByReconciler is the lateness of each reconciler's row actions.
	ByReconciler  map[string]SoakLateness
	Applied       int64 // row actions applied in the window, every reconciler
	Errors        int64 // errors counted in the window
	RiverJobs     int   // river_job rows at the window's end
	RiverJobBytes int64 // river_job's total size (table, indexes, TOAST)
	// CPU in % of one core: the whole machine, Postgres (its processes),
	// and this process (the worker and the feeder).
	MachineCPU, PostgresCPU, WorkerCPU float64
	WorkerRSS                          int64 // bytes, at the window's end
	HeapInUse                          uint64
}

// SoakLateness is one reconciler's lateness in a window.
type SoakLateness struct {
	Rows          int
	P50, P99, Max time.Duration
}

// SoakResult is a soak run: the demo's mixed stream of every reconciler's
// rows, fed at Rate items per second for Duration into one fleet process
// running every reconciler.
type SoakResult struct {
	Rate     int
	Duration time.Duration
	Window   time.Duration
	Fed      int
	Windows  []SoakWindow
	// Server is the server's settings: without autovacuum, river_job's
	// size grows with every job whatever River's retention does.
	Server store.ServerSettings
}

// lateObserver keeps lateness samples, by reconciler, until taken.
type lateObserver struct {
	mu sync.Mutex
	ms map[string][]float64
}

func (o *lateObserver) Lateness(reconciler string, d time.Duration) {
	o.mu.Lock()
	if o.ms == nil {
		o.ms = map[string][]float64{}
	}
	o.ms[reconciler] = append(o.ms[reconciler], float64(d)/float64(time.Millisecond))
	o.mu.Unlock()
}

func (o *lateObserver) take() map[string][]float64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := o.ms
	o.ms = nil
	return out
}

// rss returns this process's resident set size.
func rss() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb * 1024
			}
		}
	}
	return 0
}

// SoakLead is how far ahead of the demo's deadlines the soak writes them:
// every row is then written before it falls due (demo.Feeder.Lead).
const SoakLead = 3 * time.Second

// DefaultSoakRate is the soak's feed in demo items per second: about half
// the mixed stream's measured maximum on the 2-core machine of
// docs/benchmarks.md, about 450 items (470 row actions) per second, above
// which lateness grows without bound (docs/performance.md, "The mixed
// stream's capacity").
const DefaultSoakRate = 225

// Soak runs the soak: the fleet's defaults, every reconciler but retention
// (off by default), and the demo feeder. Every item of the feed falls due a
// bounded number of times (budgets reset once within the soak), so the
// stream of row actions is as steady as the feed.
func Soak(ctx context.Context, cfg Config, rate int, duration, window time.Duration) (*SoakResult, error) {
	e, cleanup, err := setup(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	res := &SoakResult{Rate: rate, Duration: duration, Window: window, Server: e.server}
	if !e.server.Autovacuum {
		e.log.Warn("autovacuum is off on this server: river_job's size will grow with every job of the soak, and its bound cannot be judged")
	}
	obs := &lateObserver{}
	fc := e.fleetConfig()
	fc.Observer = obs
	f, err := fleet.New(ctx, fc)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := f.Start(ctx); err != nil {
		return nil, err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = f.Stop(stopCtx)
	}()
	feedCtx, stopFeed := context.WithCancel(ctx)
	defer stopFeed()
	fed := make(chan demo.Counts, 1)
	feedErr := make(chan error, 1)
	go func() {
		feeder := demo.NewFeeder(e.pool, 1)
		feeder.BudgetResetInterval = 2 * duration
		feeder.Lead = SoakLead
		c, err := demo.Run(feedCtx, feeder, rate, duration, nil)
		fed <- c
		feedErr <- err
	}()
	totals := func() (applied, errs int64) {
		for _, s := range f.Workers.Stats().Snapshot() {
			applied += s.Applied
			errs += s.Errors
		}
		return applied, errs
	}
	start := time.Now()
	cpu, pg := sampleCPU(), samplePostgresCPU()
	applied0, errs0 := totals()
	e.progress("soak: %d demo items/s for %s, %s windows", rate, duration, window)
	for w := 1; time.Duration(w)*window <= duration; w++ {
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(time.Until(start.Add(time.Duration(w) * window))):
		}
		byReconciler := obs.take()
		applied, errs := totals()
		cpu1, pg1 := sampleCPU(), samplePostgresCPU()
		win := SoakWindow{End: time.Since(start).Round(time.Second), Applied: applied - applied0, Errors: errs - errs0,
			MachineCPU:  100 * float64(cpu1.machine-cpu.machine) / float64(window),
			PostgresCPU: 100 * float64(pg1.since(pg)) / float64(window),
			WorkerCPU:   100 * float64(cpu1.self-cpu.self) / float64(window), WorkerRSS: rss(),
			ByReconciler: map[string]SoakLateness{}}
		cpu, pg, applied0, errs0 = cpu1, pg1, applied, errs
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		win.HeapInUse = ms.HeapInuse
		var lat []float64
		for name, l := range byReconciler {
			lat = append(lat, l...)
			sl := SoakLateness{Rows: len(l)}
			sl.P50, sl.P99, sl.Max = quantiles(l)
			win.ByReconciler[name] = sl
		}
		win.Rows = len(lat)
		win.P50, win.P99, win.Max = quantiles(lat)
		if err := e.pool.QueryRow(ctx, `SELECT count(*), pg_total_relation_size('river.river_job') FROM river.river_job`).Scan(&win.RiverJobs, &win.RiverJobBytes); err != nil {
			return res, fmt.Errorf("read river_job: %w", err)
		}
		res.Windows = append(res.Windows, win)
		e.progress("soak window %d (%s): lateness p50 %s p99 %s max %s over %d rows; applied %d, errors %d; river_job %d rows %d MB; CPU machine %.0f%% postgres %.0f%% worker %.0f%%; RSS %d MB",
			w, win.End, win.P50.Round(time.Millisecond), win.P99.Round(time.Millisecond), win.Max.Round(time.Millisecond), win.Rows,
			win.Applied, win.Errors, win.RiverJobs, win.RiverJobBytes>>20, win.MachineCPU, win.PostgresCPU, win.WorkerCPU, win.WorkerRSS>>20)
	}
	stopFeed()
	c := <-fed
	if err := <-feedErr; err != nil && ctx.Err() == nil {
		return res, fmt.Errorf("feed: %w", err)
	}
	res.Fed = c.Total()
	return res, nil
}

// Soak section markers: the soak's section of docs/benchmarks.md lies
// between them, so that `make soak` replaces it and `make bench` keeps it
// (SpliceSoak).
const (
	soakBegin = "<!-- soak: written by `make soak`; `make bench` keeps it -->"
	soakEnd   = "<!-- end of soak -->"
)

// SpliceSoak returns doc with its soak section (between the markers)
// replaced by section, which carries its own markers; appended when doc has
// none.
func SpliceSoak(doc, section string) string {
	i, j := strings.Index(doc, soakBegin), strings.Index(doc, soakEnd)
	if i < 0 || j < i {
		return strings.TrimRight(doc, "\n") + "\n\n" + section
	}
	return doc[:i] + strings.TrimRight(section, "\n") + doc[j+len(soakEnd):]
}

// SoakSection returns the soak section of doc, markers included, or "".
func SoakSection(doc string) string {
	i, j := strings.Index(doc, soakBegin), strings.Index(doc, soakEnd)
	if i < 0 || j < i {
		return ""
	}
	return doc[i:j+len(soakEnd)] + "\n"
}

// Markdown renders the soak as the Soak section of docs/benchmarks.md.
func (s *SoakResult) Markdown(command, machine string, started time.Time) string {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	p("%s", soakBegin)
	p("## Soak")
	p("")
	p("Produced by `%s` on %s (%s). One fleet process with its defaults (every reconciler but retention), fed the", command, started.UTC().Format("2006-01-02 15:04 MST"), machine)
	p("demo's mixed stream of every reconciler's rows (`worker demo`: expiring leases, suspension timeouts of every")
	p("behaviour, delayed promotions, cancel groups, execution deadlines, waitpoints, budgets, stale workers) at %d items", s.Rate)
	p("per second for %s (%d items), each written %s before the demo's deadline for it (so before it falls due); every", s.Duration, s.Fed, SoakLead)
	p("item falls due a bounded number of times (a budget resets once), so the stream of row actions is steady. Per %s", s.Window)
	p("window: lateness of applied row actions (deadline to commit), row")
	p("actions applied, errors, `river_job` rows and total size, CPU in %% of one core (machine; Postgres, its processes;")
	p("worker, this process, feeder included) and the worker's resident memory. %s", ServerLine(s.Server))
	p("")
	p("| window end | rows | p50 | p99 | max | applied | errors | river_job rows | river_job size | machine CPU | Postgres CPU | worker CPU | worker RSS | Go heap |")
	p("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, w := range s.Windows {
		p("| %s | %d | %s | %s | %s | %d | %d | %d | %d MB | %.0f %% | %.0f %% | %.0f %% | %d MB | %d MB |", w.End, w.Rows,
			w.P50.Round(time.Millisecond), w.P99.Round(time.Millisecond), w.Max.Round(time.Millisecond), w.Applied, w.Errors,
			w.RiverJobs, w.RiverJobBytes>>20, w.MachineCPU, w.PostgresCPU, w.WorkerCPU, w.WorkerRSS>>20, w.HeapInUse>>20)
	}
	// Per reconciler: its p99 in each window (rows in brackets). A
	// reconciler ticking every 30 s is up to 30 s late by design; the
	// windows are compared per reconciler as well as over all.
	names := map[string]bool{}
	for _, w := range s.Windows {
		for n := range w.ByReconciler {
			names[n] = true
		}
	}
	if len(names) > 0 {
		var order []string
		for _, r := range workers.All() {
			if names[r.Name] {
				order = append(order, r.Name)
			}
		}
		p("")
		p("p99 lateness per reconciler and window (its rows in brackets; tick intervals: %s):", intervalsOf(order))
		p("")
		head, rule := "| window end |", "|---|"
		for _, n := range order {
			head += " " + n + " |"
			rule += "---|"
		}
		p("%s", head)
		p("%s", rule)
		for _, w := range s.Windows {
			line := fmt.Sprintf("| %s |", w.End)
			for _, n := range order {
				l := w.ByReconciler[n]
				line += fmt.Sprintf(" %s (%d) |", l.P99.Round(time.Millisecond), l.Rows)
			}
			p("%s", line)
		}
	}
	if n := len(s.Windows); n > 1 {
		first, last := s.Windows[0], s.Windows[n-1]
		var errs int64
		maxJobs := 0
		for _, w := range s.Windows {
			errs += w.Errors
			maxJobs = max(maxJobs, w.RiverJobs)
		}
		p("")
		// river_job fills for the completed-job retention (10 min by
		// default) and is then steady: the last window is compared with
		// the middle one, past that filling.
		mid := s.Windows[n/2]
		// Its rows are bounded by River's completed-job retention, its
		// size by autovacuum reusing the deleted jobs' space.
		size := verdict(float64(last.RiverJobBytes) <= 1.2*float64(mid.RiverJobBytes))
		if !s.Server.Autovacuum {
			size += " (autovacuum is off on this server: nothing reuses the deleted jobs' space)"
		}
		p("Aims: last window's p99 at most 1.2 × the first's (%s vs %s): %s; `river_job` bounded: rows (largest %d; last %d against %d at %s): %s,",
			last.P99.Round(time.Millisecond), first.P99.Round(time.Millisecond), verdict(float64(last.P99) <= 1.2*float64(first.P99)),
			maxJobs, last.RiverJobs, mid.RiverJobs, mid.End, verdict(float64(last.RiverJobs) <= 1.2*float64(mid.RiverJobs)))
		p("size (last %d MB against %d MB at %s): %s;", last.RiverJobBytes>>20, mid.RiverJobBytes>>20, mid.End, size)
		p("RSS flat (%d MB to %d MB): %s; no errors (%d): %s.", first.WorkerRSS>>20, last.WorkerRSS>>20,
			verdict(float64(last.WorkerRSS) <= 1.2*float64(first.WorkerRSS)), errs, verdict(errs == 0))
		// Over all rows, p99 falls within the longest-interval
		// reconcilers' spread (a 30 s sweep's rows are up to 30 s late
		// by design), so it also moves with their share of the rows: each
		// reconciler is held to the same aim.
		var missed []string
		for _, r := range workers.All() {
			f, l := first.ByReconciler[r.Name], last.ByReconciler[r.Name]
			if f.Rows > 0 && l.Rows > 0 && float64(l.P99) > 1.2*float64(f.P99) {
				missed = append(missed, fmt.Sprintf("%s %s vs %s", r.Name, l.P99.Round(time.Millisecond), f.P99.Round(time.Millisecond)))
			}
		}
		if len(missed) == 0 {
			p("Per reconciler, last window's p99 at most 1.2 × the first's: met for each.")
		} else {
			p("Per reconciler, last window's p99 at most 1.2 × the first's: **missed** by %s.", strings.Join(missed, "; "))
		}
	}
	p("%s", soakEnd)
	return b.String()
}

// intervalsOf lists the tick intervals of the named reconcilers.
func intervalsOf(names []string) string {
	var parts []string
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s %s", n, intervalOf(n)))
	}
	return strings.Join(parts, ", ")
}
