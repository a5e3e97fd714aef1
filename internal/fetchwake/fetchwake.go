// Package fetchwake wakes River's producers of one queue at chosen times, so
// a job that waits in the queue for its scheduled_at starts when that time
// comes instead of at the queue's next fetch poll.
//
// River fetches a queue's jobs when an insert notification names the queue,
// and otherwise every FetchPollInterval (1 s by default). A job that becomes
// due by the clock alone announces nothing: River's own scheduler makes jobs
// available up to 5 s before their scheduled_at, a short snooze leaves its
// job available with a future scheduled_at, and the fleet inserts row jobs
// that way ahead of their row's deadline. Each waits for the next poll.
//
// A Waker sends, at each requested time, the insert notification River's
// clients send themselves (channel "<schema>.river_insert", payload
// {"queue": "<name>"}). Times are rounded up to a granule, so a stream of due
// times costs at most one notification per granule, and nothing at all while
// no job waits. Every process listening for the queue fetches; River's fetch
// (FOR UPDATE SKIP LOCKED) gives each job to one of them.
//
// Without LISTEN/NOTIFY (River's PollOnly mode) a notification reaches no
// producer; the fleet then runs no Waker and such jobs start at the next
// poll.
package fetchwake

import (
	"container/heap"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flowfabric/ffreconcile/store"
)

// InsertTopic is the topic of River's insert notifications; the channel is
// "<schema>." + InsertTopic (River v0.51's notifier.NotificationTopicInsert,
// which River does not export; TestWakeStartsAJobRiverWouldPollFor fails if
// it changes).
const InsertTopic = "river_insert"

// DefaultGranularity is the default granule wake times are rounded up to.
const DefaultGranularity = 20 * time.Millisecond

// Config configures a Waker.
type Config struct {
	// DB sends the notifications (any pool; River's own is a good fit).
	// Required.
	DB store.DB
	// Schema is River's schema, Queue the queue to wake. Required.
	Schema, Queue string
	// Granularity: wake times are rounded up to a multiple of it. Use the
	// queue's fetch cooldown: River does not fetch more often than that
	// anyway. Defaults to DefaultGranularity.
	Granularity time.Duration
	// Logger receives failures to notify. Defaults to slog.Default().
	Logger *slog.Logger
}

// Waker sends a queue's insert notification at requested times. At is safe
// for concurrent use; Run sends.
type Waker struct {
	cfg              Config
	channel, payload string

	mu    sync.Mutex
	slots slotHeap           // pending granules, earliest first
	set   map[int64]struct{} // the same granules, to drop repeats
	kick  chan struct{}      // an earlier granule than the one Run sleeps for

	sent, failed atomic.Int64
	failing      atomic.Bool // the last notification failed
}

// New returns a Waker; nothing is sent until Run runs.
func New(cfg Config) (*Waker, error) {
	if cfg.DB == nil {
		return nil, errors.New("fetchwake: Config.DB is required")
	}
	if cfg.Schema == "" || cfg.Queue == "" {
		return nil, errors.New("fetchwake: Config.Schema and Config.Queue are required")
	}
	if cfg.Granularity <= 0 {
		cfg.Granularity = DefaultGranularity
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	payload, err := json.Marshal(map[string]string{"queue": cfg.Queue})
	if err != nil {
		return nil, err
	}
	return &Waker{
		cfg: cfg, channel: cfg.Schema + "." + InsertTopic, payload: string(payload),
		set: map[int64]struct{}{}, kick: make(chan struct{}, 1),
	}, nil
}

// At asks for a wake-up at t or within one granule after it. Times already
// past wake at once.
func (w *Waker) At(t time.Time) {
	g := int64(w.cfg.Granularity)
	slot := (t.UnixNano() + g - 1) / g
	w.mu.Lock()
	if _, ok := w.set[slot]; ok {
		w.mu.Unlock()
		return
	}
	w.set[slot] = struct{}{}
	heap.Push(&w.slots, slot)
	earliest := w.slots[0] == slot
	w.mu.Unlock()
	if earliest {
		select {
		case w.kick <- struct{}{}:
		default:
		}
	}
}

// Sent is the number of notifications sent.
func (w *Waker) Sent() int64 { return w.sent.Load() }

// Failed is the number of notifications that could not be sent.
func (w *Waker) Failed() int64 { return w.failed.Load() }

// Pending is the number of wake-ups asked for and not yet sent.
func (w *Waker) Pending() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.slots)
}

// Run sends the notifications until ctx ends.
func (w *Waker) Run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		w.mu.Lock()
		var next time.Time
		pending := len(w.slots) > 0
		if pending {
			next = time.Unix(0, w.slots[0]*int64(w.cfg.Granularity))
		}
		w.mu.Unlock()

		var fire <-chan time.Time
		if pending {
			d := time.Until(next)
			if d <= 0 {
				w.wake(ctx)
				continue
			}
			timer.Reset(d)
			fire = timer.C
		}
		select {
		case <-ctx.Done():
			return
		case <-w.kick:
			timer.Stop()
		case <-fire:
		}
	}
}

// wake drops every granule already reached and sends one notification for
// them all.
func (w *Waker) wake(ctx context.Context) {
	now := time.Now().UnixNano()
	g := int64(w.cfg.Granularity)
	w.mu.Lock()
	for len(w.slots) > 0 && w.slots[0]*g <= now {
		delete(w.set, heap.Pop(&w.slots).(int64))
	}
	w.mu.Unlock()
	if err := store.Notify(ctx, w.cfg.DB, w.channel, w.payload); err != nil {
		if ctx.Err() != nil {
			return
		}
		// A lost wake-up only delays its jobs to the next fetch poll, so
		// it is not retried; an outage is logged once, not per granule.
		w.failed.Add(1)
		if !w.failing.Swap(true) {
			w.cfg.Logger.Warn("could not wake River's producers; due jobs start at the next fetch poll until this recovers",
				"queue", w.cfg.Queue, "error", err)
		}
		return
	}
	w.sent.Add(1)
	if w.failing.Swap(false) {
		w.cfg.Logger.Info("waking River's producers again", "queue", w.cfg.Queue)
	}
}

// slotHeap is a min-heap of granule numbers.
type slotHeap []int64

func (h slotHeap) Len() int           { return len(h) }
func (h slotHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h slotHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *slotHeap) Push(x any)        { *h = append(*h, x.(int64)) }
func (h *slotHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
