package fleet

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flowfabric/ffreconcile/internal/heartbeat"
	"github.com/flowfabric/ffreconcile/periodic"
	"github.com/flowfabric/ffreconcile/store"
)

// Tags of the ticks a process inserts itself when River's leadership changes
// hands (handoff.start), shown in River UI: after it resigned a dead
// leader's term (TagLeaderTakeover), and after it stopped as the leader
// with other processes left (TagLeaderHandoff).
const (
	TagLeaderTakeover = "leader-takeover"
	TagLeaderHandoff  = "leader-handoff"
)

// handoffTimeout bounds the insert of the ticks at a handoff: it runs after
// River's client stopped, when the caller's context may have ended.
const handoffTimeout = 5 * time.Second

// handoff starts the ticks at once when River's leadership changes hands.
// River's new leader inserts its periodic jobs (RunOnStart) only once its
// maintenance services have started, one after another, each after a random
// pause of up to a second: 0-6 s after its election, during which nothing
// ticks. The process that ended the old term knows first and inserts the
// ticks itself (periodic.StartNow); each keeps its uniqueness among
// unfinished jobs, so nothing is doubled.
type handoff struct {
	f *Fleet
	// takeovers and stops count the handoffs by what ended the term.
	takeovers, stops atomic.Int64
}

// start inserts the process's ticks tagged tag, logs what it did and
// returns how many were inserted (not already waiting). A failure is logged,
// not returned: River's new leader still starts the ticks, only later.
func (h *handoff) start(ctx context.Context, tag, why string) int {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), handoffTimeout)
	defer cancel()
	logger := h.f.Config.Logger
	res, err := h.f.Client.InsertMany(ctx, periodic.StartNow(h.f.Config.ticks(), tag))
	if err != nil {
		logger.Warn("could not start the ticks at a leadership change; River's new leader starts them within seconds",
			"reason", why, "error", err)
		return 0
	}
	inserted := 0
	for _, r := range res {
		if !r.UniqueSkippedAsDuplicate {
			inserted++
		}
	}
	logger.Info("started the ticks at a leadership change, ahead of River's new leader",
		"reason", why, "ticks_inserted", inserted, "ticks_already_waiting", len(res)-inserted)
	return inserted
}

// afterTakeover starts the ticks once this process resigned a dead
// leader's term.
func (h *handoff) afterTakeover(ctx context.Context, deadLeader string) {
	h.takeovers.Add(1)
	h.start(ctx, TagLeaderTakeover, "took over from dead leader "+deadLeader)
}

// leadsWithOthers reports whether this process leads and another is alive
// to lead next; read before River's client stops (it resigns as it stops).
func (h *handoff) leadsWithOthers(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), handoffTimeout)
	defer cancel()
	ok, err := store.LeadsWithOthers(ctx, h.f.RiverPool, h.f.Config.RiverSchema, h.f.Client.ID(), heartbeat.LiveFor)
	if err != nil {
		h.f.Config.Logger.Warn("could not read whether this process leads; stopping without starting the ticks for the next leader",
			"error", err)
		return false
	}
	return ok
}

// afterStop starts the ticks once this process, the leader, stopped and so
// resigned.
func (h *handoff) afterStop(ctx context.Context) {
	h.stops.Add(1)
	h.start(ctx, TagLeaderHandoff, "stopped as the leader")
}

// metrics exports what h did.
func (h *handoff) metrics() []prometheus.Collector {
	handoffs := func(reason string, n *atomic.Int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "ffreconcile", Name: "leader_handoffs_total", ConstLabels: prometheus.Labels{"reason": reason},
			Help: "River leaderships this process ended (a dead leader's, taken over; its own, on stop) and started the ticks for at once.",
		}, func() float64 { return float64(n.Load()) })
	}
	return []prometheus.Collector{handoffs("takeover", &h.takeovers), handoffs("stop", &h.stops)}
}
