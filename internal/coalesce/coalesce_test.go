package coalesce

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// recorder is a Func that records the batches it ran and can be held.
type recorder struct {
	mu      sync.Mutex
	batches [][]string
	hold    chan struct{} // when non-nil, the first batch waits on it
	started chan struct{} // closed when the first batch started
	once    sync.Once
	fail    func(items []string) error
}

func (r *recorder) run(_ context.Context, key string, items []string) ([]string, error) {
	r.mu.Lock()
	r.batches = append(r.batches, slices.Clone(items))
	first := len(r.batches) == 1
	r.mu.Unlock()
	if first && r.hold != nil {
		r.once.Do(func() { close(r.started) })
		<-r.hold
	}
	if r.fail != nil {
		if err := r.fail(items); err != nil {
			return nil, err
		}
	}
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = key + ":" + it
	}
	return out, nil
}

func (r *recorder) got() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.batches)
}

type result struct {
	item, res string
	err       error
}

func collect(wg *sync.WaitGroup, out chan result) map[string]result {
	wg.Wait()
	close(out)
	m := map[string]result{}
	for r := range out {
		m[r.item] = r
	}
	return m
}

// waitPending waits until n calls are queued (not yet taken).
func waitPending(t *testing.T, c *Coalescer[string, string, string], n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c.mu.Lock()
		got := len(c.pending)
		c.mu.Unlock()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d calls pending, want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestIdleCallRunsAloneAtOnce(t *testing.T) {
	r := &recorder{}
	c := New(Config{MaxBatch: 10, InFlight: 1}, r.run)
	res, err := c.Do(context.Background(), "p1", "a")
	if err != nil || res != "p1:a" {
		t.Fatalf("Do = %q, %v", res, err)
	}
	if got := r.got(); !slices.EqualFunc(got, [][]string{{"a"}}, slices.Equal) {
		t.Fatalf("batches %v", got)
	}
}

// TestQueuedCallsBatchByKey: while one batch is held in flight, calls queue;
// the next batches take the oldest call's key first, up to MaxBatch, in
// arrival order, and every caller gets its own result.
func TestQueuedCallsBatchByKey(t *testing.T) {
	tests := []struct {
		name     string
		maxBatch int
		keys     []string
		items    []string
		want     [][]string // batches after the held first one
	}{
		{
			name:     "one key",
			maxBatch: 10,
			keys:     []string{"p1", "p1", "p1"},
			items:    []string{"b", "c", "d"},
			want:     [][]string{{"b", "c", "d"}},
		},
		{
			name:     "two keys, oldest key first",
			maxBatch: 10,
			keys:     []string{"p2", "p1", "p2", "p1", "p2"},
			items:    []string{"b", "c", "d", "e", "f"},
			want:     [][]string{{"b", "d", "f"}, {"c", "e"}},
		},
		{
			name:     "split at MaxBatch",
			maxBatch: 2,
			keys:     []string{"p1", "p1", "p1", "p1", "p1"},
			items:    []string{"b", "c", "d", "e", "f"},
			want:     [][]string{{"b", "c"}, {"d", "e"}, {"f"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &recorder{hold: make(chan struct{}), started: make(chan struct{})}
			c := New(Config{MaxBatch: tt.maxBatch, InFlight: 1}, r.run)
			first := make(chan result, 1)
			go func() {
				res, err := c.Do(context.Background(), "p0", "a")
				first <- result{"a", res, err}
			}()
			<-r.started
			var wg sync.WaitGroup
			out := make(chan result, len(tt.items))
			for i := range tt.items {
				wg.Add(1)
				go func() {
					defer wg.Done()
					res, err := c.Do(context.Background(), tt.keys[i], tt.items[i])
					out <- result{tt.items[i], res, err}
				}()
				waitPending(t, c, i+1)
			}
			close(r.hold)
			got := collect(&wg, out)
			if f := <-first; f.err != nil || f.res != "p0:a" {
				t.Fatalf("first call = %q, %v", f.res, f.err)
			}
			for i, it := range tt.items {
				if g := got[it]; g.err != nil || g.res != tt.keys[i]+":"+it {
					t.Errorf("item %s = %q, %v", it, g.res, g.err)
				}
			}
			batches := r.got()[1:]
			if !slices.EqualFunc(batches, tt.want, slices.Equal) {
				t.Fatalf("batches %v, want %v", batches, tt.want)
			}
		})
	}
}

// TestFailedBatchIsolatesTheBadItem: a batch error retries each item alone,
// so only the item that fails alone gets an error.
func TestFailedBatchIsolatesTheBadItem(t *testing.T) {
	r := &recorder{hold: make(chan struct{}), started: make(chan struct{})}
	r.fail = func(items []string) error {
		if slices.Contains(items, "bad") {
			return errors.New("row bad is malformed")
		}
		return nil
	}
	c := New(Config{MaxBatch: 10, InFlight: 1}, r.run)
	go func() { _, _ = c.Do(context.Background(), "p0", "a") }()
	<-r.started
	var wg sync.WaitGroup
	out := make(chan result, 3)
	for i, it := range []string{"b", "bad", "c"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := c.Do(context.Background(), "p1", it)
			out <- result{it, res, err}
		}()
		waitPending(t, c, i+1)
	}
	close(r.hold)
	got := collect(&wg, out)
	if got["bad"].err == nil || got["bad"].err.Error() != "row bad is malformed" {
		t.Fatalf("bad item: %v", got["bad"].err)
	}
	for _, it := range []string{"b", "c"} {
		if got[it].err != nil || got[it].res != "p1:"+it {
			t.Fatalf("item %s = %q, %v", it, got[it].res, got[it].err)
		}
	}
	want := [][]string{{"a"}, {"b", "bad", "c"}, {"b"}, {"bad"}, {"c"}}
	if b := r.got(); !slices.EqualFunc(b, want, slices.Equal) {
		t.Fatalf("batches %v, want %v", b, want)
	}
}

func TestPanicAndShortResultsBecomeErrors(t *testing.T) {
	tests := []struct {
		name    string
		run     Func[string, string, string]
		wantErr string
	}{
		{"panic", func(context.Context, string, []string) ([]string, error) { panic("boom") }, "coalesce: batch panicked: boom"},
		{"short", func(context.Context, string, []string) ([]string, error) { return nil, nil }, "coalesce: 0 results for 1 items"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := New(Config{}, tt.run)
			_, err := c.Do(context.Background(), "p", "x")
			if err == nil || err.Error() != tt.wantErr {
				t.Fatalf("err = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

// TestCancelledBeforeTakenNeverRuns: a caller that gives up while queued
// gets its context's error and its item is not run.
func TestCancelledBeforeTakenNeverRuns(t *testing.T) {
	r := &recorder{hold: make(chan struct{}), started: make(chan struct{})}
	c := New(Config{MaxBatch: 10, InFlight: 1}, r.run)
	go func() { _, _ = c.Do(context.Background(), "p0", "a") }()
	<-r.started
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := c.Do(ctx, "p1", "gone")
		errc <- err
	}()
	waitPending(t, c, 1)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	close(r.hold)
	if res, err := c.Do(context.Background(), "p1", "b"); err != nil || res != "p1:b" {
		t.Fatalf("Do = %q, %v", res, err)
	}
	for _, b := range r.got() {
		if slices.Contains(b, "gone") {
			t.Fatalf("cancelled item ran: %v", r.got())
		}
	}
}

// TestManyConcurrentCallers: every caller of a busy coalescer gets exactly
// its own result, with batches no larger than MaxBatch.
func TestManyConcurrentCallers(t *testing.T) {
	r := &recorder{}
	c := New(Config{MaxBatch: 7, InFlight: 3}, func(ctx context.Context, key string, items []string) ([]string, error) {
		time.Sleep(time.Millisecond)
		return r.run(ctx, key, items)
	})
	var wg sync.WaitGroup
	const n = 500
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key, item := fmt.Sprintf("p%d", i%4), fmt.Sprint(i)
			res, err := c.Do(context.Background(), key, item)
			if err != nil || res != key+":"+item {
				errs <- fmt.Errorf("item %s = %q, %v", item, res, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	total := 0
	for _, b := range r.got() {
		if len(b) > 7 {
			t.Fatalf("batch of %d > MaxBatch", len(b))
		}
		total += len(b)
	}
	if total != n {
		t.Fatalf("%d items run, want %d", total, n)
	}
}
