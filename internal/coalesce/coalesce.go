// Package coalesce runs concurrent single-item requests as batches.
//
// Row jobs are one River job per row, but their SQL need not be one
// statement per row: on a small server most of a single-row statement's cost
// is planning it and committing it, not the row. A Coalescer lets each job
// ask for its own row while the statements carry several: requests queue
// while a batch is in flight, and the next batch takes every queued request
// of the oldest request's group (up to a size limit). Nothing waits for a
// batch to fill, so a request reaching an idle coalescer runs at once,
// alone; batching only appears under load, where it pays.
//
// Every request gets its own result. When a batch fails as a whole, each of
// its requests is retried alone, so one bad row fails only its own request.
package coalesce

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Func runs one batch: items all share key, and it returns one result per
// item, in order, or an error for the whole batch.
type Func[K comparable, T, R any] func(ctx context.Context, key K, items []T) ([]R, error)

// Config sizes a Coalescer.
type Config struct {
	// MaxBatch is the most items one call of the Func receives.
	MaxBatch int
	// InFlight is the most batches run at once.
	InFlight int
	// Timeout bounds one batch. A batch runs on behalf of several callers,
	// so it does not stop when the caller that happens to run it gives up.
	Timeout time.Duration
}

// Coalescer batches requests to one Func. The zero value is not usable; use
// New.
type Coalescer[K comparable, T, R any] struct {
	run   Func[K, T, R]
	cfg   Config
	slots chan struct{}

	mu      sync.Mutex
	pending []*call[K, T, R]
}

type call[K comparable, T, R any] struct {
	key  K
	item T
	res  R
	err  error
	done chan struct{}
}

// New returns a Coalescer for run.
func New[K comparable, T, R any](cfg Config, run Func[K, T, R]) *Coalescer[K, T, R] {
	cfg.MaxBatch = max(cfg.MaxBatch, 1)
	cfg.InFlight = max(cfg.InFlight, 1)
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	return &Coalescer[K, T, R]{run: run, cfg: cfg, slots: make(chan struct{}, cfg.InFlight)}
}

// Do runs item, alone or in a batch with other callers' items of the same
// key, and returns its result. If ctx ends before the item was taken into a
// batch, Do returns ctx's error and the item is never run; once taken, Do
// waits for the batch, whose outcome is the item's.
func (c *Coalescer[K, T, R]) Do(ctx context.Context, key K, item T) (R, error) {
	cl := &call[K, T, R]{key: key, item: item, done: make(chan struct{})}
	c.mu.Lock()
	c.pending = append(c.pending, cl)
	c.mu.Unlock()
	for {
		select {
		case <-cl.done:
			return cl.res, cl.err
		case c.slots <- struct{}{}:
			// Whoever gets a slot runs the oldest queued batch, which
			// need not contain its own item; it then loops to find out.
			// Nothing queued means a batch in flight holds its item.
			batch := c.take()
			if len(batch) > 0 {
				c.exec(ctx, batch)
			}
			<-c.slots
			if len(batch) == 0 {
				<-cl.done
				return cl.res, cl.err
			}
		case <-ctx.Done():
			if c.remove(cl) {
				var zero R
				return zero, ctx.Err()
			}
			<-cl.done
			return cl.res, cl.err
		}
	}
}

// take removes and returns the oldest pending call and up to MaxBatch-1
// more of its key, oldest first.
func (c *Coalescer[K, T, R]) take() []*call[K, T, R] {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.pending) == 0 {
		return nil
	}
	key := c.pending[0].key
	batch := make([]*call[K, T, R], 0, min(len(c.pending), c.cfg.MaxBatch))
	rest := c.pending[:0]
	for _, cl := range c.pending {
		if cl.key == key && len(batch) < c.cfg.MaxBatch {
			batch = append(batch, cl)
		} else {
			rest = append(rest, cl)
		}
	}
	clear(c.pending[len(rest):])
	c.pending = rest
	return batch
}

// remove drops cl from the queue; false means a batch already took it.
func (c *Coalescer[K, T, R]) remove(cl *call[K, T, R]) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, p := range c.pending {
		if p == cl {
			c.pending = append(c.pending[:i], c.pending[i+1:]...)
			return true
		}
	}
	return false
}

// exec runs batch and settles every call in it.
func (c *Coalescer[K, T, R]) exec(ctx context.Context, batch []*call[K, T, R]) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.Timeout)
	defer cancel()
	items := make([]T, len(batch))
	for i, cl := range batch {
		items[i] = cl.item
	}
	res, err := c.safeRun(ctx, batch[0].key, items)
	if err == nil && len(res) != len(batch) {
		err = fmt.Errorf("coalesce: %d results for %d items", len(res), len(batch))
	}
	switch {
	case err == nil:
		for i, cl := range batch {
			cl.res = res[i]
		}
	case len(batch) == 1:
		batch[0].err = err
	default:
		// Isolate the failure: each item alone, so only a bad one fails.
		for _, cl := range batch {
			r, err := c.safeRun(ctx, cl.key, []T{cl.item})
			if err == nil && len(r) != 1 {
				err = fmt.Errorf("coalesce: %d results for 1 item", len(r))
			}
			if err != nil {
				cl.err = err
			} else {
				cl.res = r[0]
			}
		}
	}
	for _, cl := range batch {
		close(cl.done)
	}
}

// safeRun turns a panic in run into an error: the batch's other callers
// must not wait forever on a runner that died.
func (c *Coalescer[K, T, R]) safeRun(ctx context.Context, key K, items []T) (res []R, err error) {
	defer func() {
		if p := recover(); p != nil {
			res, err = nil, fmt.Errorf("coalesce: batch panicked: %v", p)
		}
	}()
	return c.run(ctx, key, items)
}
