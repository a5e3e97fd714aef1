package bench

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuSample is the machine's busy CPU time and this process's, at one moment.
// The benchmark runs on the same machine as Postgres, so the difference of two
// samples is what one design cost in total: its client, its backends and the
// server's background work (WAL writer, checkpointer, autovacuum).
type cpuSample struct {
	machine, self time.Duration
}

// CPUCost is the CPU one design spent per row acted on.
type CPUCost struct {
	Machine, Self time.Duration // per row; Self is this process (client side)
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
	return s
}

// per returns the CPU spent since s0, per row.
func (s0 cpuSample) per(rows int) CPUCost {
	s1 := sampleCPU()
	if rows <= 0 {
		return CPUCost{}
	}
	return CPUCost{Machine: (s1.machine - s0.machine) / time.Duration(rows), Self: (s1.self - s0.self) / time.Duration(rows)}
}

func (c CPUCost) String() string {
	return fmt.Sprintf("%d µs (client %d µs)", c.Machine.Microseconds(), c.Self.Microseconds())
}
