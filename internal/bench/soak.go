package bench

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/flowfabric/ffreconcile/internal/demo"
	"github.com/flowfabric/ffreconcile/internal/fleet"
)

// SoakWindow is one window of a soak run.
type SoakWindow struct {
	End           time.Duration // since the start
	Rows          int           // row samples of lateness (applied row actions)
	P50, P99, Max time.Duration
	Applied       int64 // row actions applied in the window, every reconciler
	Errors        int64 // errors counted in the window
	RiverJobs     int   // river_job rows at the window's end
	RiverJobBytes int64 // river_job's total size (table, indexes, TOAST)
	MachineCPU    float64
	WorkerCPU     float64 // % of one core, this process (the worker)
	WorkerRSS     int64   // bytes, at the window's end
	HeapInUse     uint64
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
}

// lateObserver keeps lateness samples until taken.
type lateObserver struct {
	mu sync.Mutex
	ms []float64
}

func (o *lateObserver) Lateness(_ string, d time.Duration) {
	o.mu.Lock()
	o.ms = append(o.ms, float64(d)/float64(time.Millisecond))
	o.mu.Unlock()
}

func (o *lateObserver) take() []float64 {
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

// Soak runs the soak: the fleet's defaults, every reconciler but retention
// (off by default), and the demo feeder.
func Soak(ctx context.Context, cfg Config, rate int, duration, window time.Duration) (*SoakResult, error) {
	e, cleanup, err := setup(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	res := &SoakResult{Rate: rate, Duration: duration, Window: window}
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
		c, err := demo.Run(feedCtx, demo.NewFeeder(e.pool, 1), rate, duration, nil)
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
	cpu := sampleCPU()
	applied0, errs0 := totals()
	e.progress("soak: %d demo items/s for %s, %s windows", rate, duration, window)
	for w := 1; time.Duration(w)*window <= duration; w++ {
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(time.Until(start.Add(time.Duration(w) * window))):
		}
		lat := obs.take()
		applied, errs := totals()
		cpu1 := sampleCPU()
		win := SoakWindow{End: time.Since(start).Round(time.Second), Rows: len(lat), Applied: applied - applied0, Errors: errs - errs0,
			MachineCPU: 100 * float64(cpu1.machine-cpu.machine) / float64(window),
			WorkerCPU:  100 * float64(cpu1.self-cpu.self) / float64(window), WorkerRSS: rss()}
		cpu, applied0, errs0 = cpu1, applied, errs
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		win.HeapInUse = ms.HeapInuse
		if len(lat) > 0 {
			sort.Float64s(lat)
			q := func(p float64) time.Duration {
				return time.Duration(lat[min(len(lat)-1, int(p*float64(len(lat))))] * float64(time.Millisecond))
			}
			win.P50, win.P99, win.Max = q(0.5), q(0.99), time.Duration(lat[len(lat)-1]*float64(time.Millisecond))
		}
		if err := e.pool.QueryRow(ctx, `SELECT count(*), pg_total_relation_size('river.river_job') FROM river.river_job`).Scan(&win.RiverJobs, &win.RiverJobBytes); err != nil {
			return res, fmt.Errorf("read river_job: %w", err)
		}
		res.Windows = append(res.Windows, win)
		e.progress("soak window %d (%s): lateness p50 %s p99 %s max %s over %d rows; applied %d, errors %d; river_job %d rows %d MB; CPU machine %.0f%% worker %.0f%%; RSS %d MB",
			w, win.End, win.P50.Round(time.Millisecond), win.P99.Round(time.Millisecond), win.Max.Round(time.Millisecond), win.Rows,
			win.Applied, win.Errors, win.RiverJobs, win.RiverJobBytes>>20, win.MachineCPU, win.WorkerCPU, win.WorkerRSS>>20)
	}
	stopFeed()
	c := <-fed
	if err := <-feedErr; err != nil && ctx.Err() == nil {
		return res, fmt.Errorf("feed: %w", err)
	}
	res.Fed = c.Total()
	return res, nil
}

// Markdown renders the soak for docs/soak.md.
func (s *SoakResult) Markdown(command, machine string, started time.Time) string {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	p("# Soak")
	p("")
	p("Produced by `%s` on %s (%s). One fleet process with its defaults (every reconciler but retention), fed the", command, started.UTC().Format("2006-01-02 15:04 MST"), machine)
	p("demo's mixed stream of every reconciler's rows (`worker demo`: expiring leases, suspension timeouts of every")
	p("behaviour, delayed promotions, cancel groups, execution deadlines, waitpoints, budgets, stale workers) at %d items", s.Rate)
	p("per second for %s (%d items). Per %s window: lateness of applied row actions (deadline to commit), row", s.Duration, s.Fed, s.Window)
	p("actions applied, errors, `river_job` rows and total size, CPU (machine: the worker, Postgres and the feeder, in %%")
	p("of one core; worker: this process, feeder included) and the worker's resident memory.")
	p("")
	p("| window end | rows | p50 | p99 | max | applied | errors | river_job rows | river_job size | machine CPU | worker CPU | worker RSS | Go heap |")
	p("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, w := range s.Windows {
		p("| %s | %d | %s | %s | %s | %d | %d | %d | %d MB | %.0f %% | %.0f %% | %d MB | %d MB |", w.End, w.Rows,
			w.P50.Round(time.Millisecond), w.P99.Round(time.Millisecond), w.Max.Round(time.Millisecond), w.Applied, w.Errors,
			w.RiverJobs, w.RiverJobBytes>>20, w.MachineCPU, w.WorkerCPU, w.WorkerRSS>>20, w.HeapInUse>>20)
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
		p("Aims: last window's p99 at most 1.2 × the first's (%s vs %s): %s; `river_job` bounded (largest %d rows; last %d against %d at %s): %s;",
			last.P99.Round(time.Millisecond), first.P99.Round(time.Millisecond), verdict(float64(last.P99) <= 1.2*float64(first.P99)),
			maxJobs, last.RiverJobs, mid.RiverJobs, mid.End, verdict(float64(last.RiverJobs) <= 1.2*float64(mid.RiverJobs)))
		p("RSS flat (%d MB to %d MB): %s; no errors (%d): %s.", first.WorkerRSS>>20, last.WorkerRSS>>20,
			verdict(float64(last.WorkerRSS) <= 1.2*float64(first.WorkerRSS)), errs, verdict(errs == 0))
	}
	return b.String()
}
