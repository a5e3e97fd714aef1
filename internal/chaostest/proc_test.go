package chaostest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// binDir holds the worker binary, built once per test binary.
var (
	binDir   string
	buildOne sync.Once
	binPath  string
	buildErr error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "ffchaos-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// workerBinary builds ./cmd/worker from the module root once and returns
// its path.
func workerBinary(t *testing.T) string {
	t.Helper()
	buildOne.Do(func() {
		out, err := exec.Command("go", "env", "GOMOD").Output()
		if err != nil {
			buildErr = fmt.Errorf("go env GOMOD: %w", err)
			return
		}
		gomod := strings.TrimSpace(string(out))
		if gomod == "" || gomod == os.DevNull {
			buildErr = errors.New("go env GOMOD: not inside a module")
			return
		}
		binPath = filepath.Join(binDir, "worker")
		build := exec.Command("go", "build", "-o", binPath, "./cmd/worker")
		build.Dir = filepath.Dir(gomod)
		if out, err := build.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/worker: %w\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// cleanEnv is the environment without settings that would change what a
// worker does behind the test's flags.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "FF_") || strings.HasPrefix(name, "OTEL_") || strings.HasPrefix(name, "PG") ||
			name == "DATABASE_URL" || name == "TEST_DATABASE_URL" {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// runBinary runs the worker binary to completion and returns its exit code,
// stdout and stderr.
func runBinary(t *testing.T, timeout time.Duration, args ...string) (int, string, string) {
	t.Helper()
	return runBinaryEnv(t, timeout, nil, args...)
}

// runBinaryEnv is runBinary with extra environment variables.
func runBinaryEnv(t *testing.T, timeout time.Duration, env []string, args ...string) (int, string, string) {
	t.Helper()
	// Built before the clock starts: the first caller builds the binary,
	// and every test calling at once waits for that build, which on a busy
	// machine took most of a minute's timeout (a migrate "timed out" with
	// nothing on its stderr).
	bin := workerBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	// On the timeout, SIGQUIT: the Go runtime prints every goroutine's
	// stack to stderr, which the failure shows, before the process exits.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGQUIT) }
	cmd.WaitDelay = 5 * time.Second
	cmd.Env = append(cleanEnv(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var exitErr *exec.ExitError
	switch {
	case err == nil:
		return 0, out.String(), errb.String()
	case errors.As(err, &exitErr) && ctx.Err() == nil:
		return exitErr.ExitCode(), out.String(), errb.String()
	}
	t.Fatalf("worker %v: %v (stderr %q)", args, err, errb.String())
	return 0, "", ""
}

// freeAddr returns a loopback address with a port nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// proc is one `worker run` process slot: started, killed and restarted with
// the same client id, address and log file.
type proc struct {
	clientID string
	addr     string
	logPath  string
	args     []string

	mu          sync.Mutex
	cmd         *exec.Cmd
	done        chan struct{} // closed when the current incarnation exits
	exitErr     error
	expectExit  bool
	monitored   bool // /readyz failures count (started, not being killed)
	ready       bool // the current incarnation answered /readyz 200 once
	incarnation int
	unexpected  []string // exits nobody asked for
}

func newProc(t *testing.T, bin, dbURL, clientID string, extra ...string) *proc {
	p := &proc{clientID: clientID, addr: freeAddr(t), logPath: filepath.Join(t.TempDir(), clientID+".log")}
	p.args = append([]string{"run", "--database-url", dbURL, "--http-addr", p.addr, "--client-id", clientID,
		"--log-format", "json", "--ui=false"}, extra...)
	p.args = append([]string{bin}, p.args...)
	return p
}

// start starts a new incarnation; it does not wait for readiness.
func (p *proc) start() error {
	f, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.incarnation++
	fmt.Fprintf(f, "### chaostest: incarnation %d of %s started at %s\n", p.incarnation, p.clientID, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(p.args[0], p.args[1:]...)
	cmd.Env = cleanEnv()
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", p.clientID, err)
	}
	done := make(chan struct{})
	p.cmd, p.done, p.expectExit, p.exitErr, p.ready = cmd, done, false, nil, false
	incarnation := p.incarnation
	go func() {
		err := cmd.Wait()
		fmt.Fprintf(f, "### chaostest: incarnation %d exited at %s: %v\n", incarnation, time.Now().Format(time.RFC3339Nano), err)
		f.Close()
		p.mu.Lock()
		p.exitErr = err
		p.monitored = false
		// An exit before it was ready is a failed start, which
		// startReady reports (or retries).
		if !p.expectExit && p.ready {
			p.unexpected = append(p.unexpected, fmt.Sprintf("%s incarnation %d exited on its own: %v", p.clientID, incarnation, err))
		}
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

// waitReady waits until /readyz answers 200, then counts its failures.
func (p *proc) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	client := &http.Client{Timeout: 2 * time.Second}
	for {
		p.mu.Lock()
		done := p.done
		p.mu.Unlock()
		select {
		case <-done:
			return fmt.Errorf("%s exited before it was ready: %w", p.clientID, errExitedEarly)
		default:
		}
		if resp, err := client.Get("http://" + p.addr + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				p.mu.Lock()
				p.monitored, p.ready = true, true
				p.mu.Unlock()
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %s", p.clientID, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

var errExitedEarly = errors.New("exited early")

// startReady starts a new incarnation and waits until it is ready. A start
// refused because the server has no connection slot left (other tests share
// it; SQLSTATE 53300) is retried until timeout: the worker reported it
// clearly and exited, which is right, but it is not what this test probes.
func (p *proc) startReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if err := p.start(); err != nil {
			return err
		}
		err := p.waitReady(time.Until(deadline))
		if err == nil {
			return nil
		}
		if errors.Is(err, errExitedEarly) && time.Now().Before(deadline) && strings.Contains(p.logTail(3), "SQLSTATE 53300") {
			time.Sleep(time.Second)
			continue
		}
		return fmt.Errorf("%w; log:\n%s", err, p.logTail(5))
	}
}

// signal sends sig to the current incarnation and waits up to wait for it
// to exit (SIGKILL is followed when it does not).
func (p *proc) signal(sig syscall.Signal, wait time.Duration) error {
	p.mu.Lock()
	p.expectExit = true
	p.monitored = false
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	default:
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(wait):
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("%s did not exit within %s of %s; killed", p.clientID, wait, sig)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if sig == syscall.SIGKILL {
		return nil
	}
	return p.exitErr
}

func (p *proc) kill() { _ = p.signal(syscall.SIGKILL, 10*time.Second) }

// stop asks the process to stop gracefully and returns its exit error.
func (p *proc) stop() error { return p.signal(syscall.SIGTERM, 30*time.Second) }

func (p *proc) isMonitored() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.monitored
}

func (p *proc) unexpectedExits() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.unexpected...)
}

// logTail returns the last n lines of the process's log.
func (p *proc) logTail(n int) string {
	f, err := os.Open(p.logPath)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > 2*n {
			lines = append(lines[:0], lines[len(lines)-n:]...)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// logContains reports lines of the process's log containing any of subs.
func (p *proc) logGrep(subs ...string) []string {
	data, err := os.ReadFile(p.logPath)
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		for _, s := range subs {
			if strings.Contains(line, s) {
				out = append(out, line)
				break
			}
		}
	}
	return out
}

// readyzProbe polls every process's /readyz every 200 ms while it is
// monitored and records what failed.
type readyzProbe struct {
	mu       sync.Mutex
	polls    int
	failures []readyzFailure
}

type readyzFailure struct {
	ClientID string    `json:"client_id"`
	At       time.Time `json:"at"`
	What     string    `json:"what"`
}

func (r *readyzProbe) run(ctx context.Context, procs []*proc) {
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A slow answer is an answer: /readyz waits up to 10 s for
			// the database on a busy machine; a failure is a 503, or no
			// answer at all.
			client := &http.Client{Timeout: 15 * time.Second}
			tick := time.NewTicker(200 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				if !p.isMonitored() {
					continue
				}
				at := time.Now()
				what := ""
				resp, err := client.Get("http://" + p.addr + "/readyz")
				if err != nil {
					what = err.Error()
				} else {
					if resp.StatusCode != http.StatusOK {
						what = resp.Status
					}
					resp.Body.Close()
				}
				// A process killed while the request was in flight is not
				// a readiness failure.
				if !p.isMonitored() {
					continue
				}
				r.mu.Lock()
				r.polls++
				if what != "" {
					r.failures = append(r.failures, readyzFailure{ClientID: p.clientID, At: at, What: what})
				}
				r.mu.Unlock()
			}
		}()
	}
	wg.Wait()
}

func (r *readyzProbe) snapshot() (int, []readyzFailure) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.polls, append([]readyzFailure(nil), r.failures...)
}
