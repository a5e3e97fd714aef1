package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// cpuSample is the machine's busy CPU time and this process's, at one moment.
// The benchmark runs on the same machine as Postgres, so the difference of two
// samples is what one design cost in total: its client, its backends and the
// server's background work (WAL writer, checkpointer, autovacuum).
type cpuSample struct {
	machine, self time.Duration
	pg            postgresCPU // each Postgres process's, for a split by pool
}

// CPUCost is the CPU one design spent per row acted on.
type CPUCost struct {
	Machine, Self time.Duration // per row; Self is this process (client side)
	// Postgres is Postgres's part per row by who spent it (see
	// perByPool); nil when not split.
	Postgres map[string]time.Duration
}

func sampleCPU() cpuSample {
	var s cpuSample
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		f := strings.Fields(line)
		// cpu user nice system idle iowait irq softirq steal ...
		for i := 1; i < len(f) && i <= 8; i++ {
			if i == 4 || i == 5 {
				continue // idle and iowait
			}
			v, _ := strconv.ParseInt(f[i], 10, 64)
			s.machine += time.Duration(v) * time.Second / clockTicks
		}
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		s.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	s.pg = samplePostgresCPU()
	return s
}

// per returns the CPU spent since s0, per row.
func (s0 cpuSample) per(rows int) CPUCost {
	s1 := sampleCPU()
	if rows <= 0 {
		return CPUCost{}
	}
	return s0.costTo(s1, rows)
}

// costTo is the machine's and this process's CPU from s0 to s1, per row.
func (s0 cpuSample) costTo(s1 cpuSample, rows int) CPUCost {
	return CPUCost{Machine: (s1.machine - s0.machine) / time.Duration(rows), Self: (s1.self - s0.self) / time.Duration(rows)}
}

// Who spent Postgres's CPU, by the application name each of the fleet's
// pools gives its connections (and the benchmark's own pool, which inserts
// the no-op runs' row jobs).
const (
	pgRiver = "River's pool" // fetches, completions, River's maintenance
	pgWork  = "work pool"    // scans (their reads and row job inserts), row statements
	pgTick  = "tick pool"    // tick queries
	pgBench = "bench pool"   // the no-op scans' inserts
	pgOther = "other"        // WAL writer, checkpointer, autovacuum, …
)

// PostgresParts are perByPool's parts in the order a report lists them.
var PostgresParts = []string{pgRiver, pgWork, pgTick, pgBench, pgOther}

// perByPool is per with Postgres's part split by who spent it (see
// PostgresParts): each backend's CPU by the pool its application name
// names, every other process under other. Backends are named as they are
// now, so it is read before the pools close.
func (s0 cpuSample) perByPool(ctx context.Context, pool *pgxpool.Pool, rows int) (CPUCost, error) {
	s1 := sampleCPU()
	if rows <= 0 {
		return CPUCost{}, nil
	}
	cost := s0.costTo(s1, rows)
	r, err := pool.Query(ctx, `SELECT pid, application_name FROM pg_stat_activity WHERE backend_type = 'client backend'`)
	if err != nil {
		return CPUCost{}, fmt.Errorf("backends' application names: %w", err)
	}
	names := map[int]string{}
	var pid int
	var name string
	if _, err := pgx.ForEachRow(r, []any{&pid, &name}, func() error { names[pid] = name; return nil }); err != nil {
		return CPUCost{}, fmt.Errorf("backends' application names: %w", err)
	}
	cost.Postgres = map[string]time.Duration{}
	for pid, cpu := range s1.pg {
		cost.Postgres[pgPart(names[pid])] += (cpu - s0.pg[pid]) / time.Duration(rows)
	}
	return cost, nil
}

func pgPart(appName string) string {
	for prefix, part := range map[string]string{"ffreconcile-river": pgRiver, "ffreconcile-work": pgWork,
		"ffreconcile-tick": pgTick, "ffreconcile-bench": pgBench} {
		if strings.HasPrefix(appName, prefix) {
			return part
		}
	}
	return pgOther
}

func (c CPUCost) String() string {
	return fmt.Sprintf("%d µs (client %d µs)", c.Machine.Microseconds(), c.Self.Microseconds())
}

// procCPU returns the user+system CPU time and the command name of process
// pid, from /proc.
func procCPU(pid int) (time.Duration, string, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, "", false
	}
	// The command name is in parentheses and may contain spaces; the
	// fields after it are counted from its closing one.
	s := string(b)
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closing < open || closing+2 > len(s) {
		return 0, "", false
	}
	fields := strings.Fields(s[closing+2:])
	if len(fields) < 13 {
		return 0, "", false
	}
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / clockTicks, s[open+1 : closing], true
}

// postgresCPU is the CPU time of each Postgres process of the machine at
// one moment.
type postgresCPU map[int]time.Duration

// samplePostgresCPU reads every process named postgres (the server, its
// backends and background workers; the benchmark runs beside its server).
func samplePostgresCPU() postgresCPU {
	out := postgresCPU{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if cpu, comm, ok := procCPU(pid); ok && comm == "postgres" {
			out[pid] = cpu
		}
	}
	return out
}

// since is the CPU Postgres spent from s0 to s: what each process spent
// meanwhile (all of it for one started since). A process that exited in
// between is missed, which the long-lived pools of a fleet keep small.
func (s postgresCPU) since(s0 postgresCPU) time.Duration {
	var d time.Duration
	for pid, cpu := range s {
		d += cpu - s0[pid]
	}
	return d
}
