// Command testreport turns `go test -json` into progress a person can follow:
// one line per finished top-level test and per package, a line every 30 s
// naming what is still running, the whole output of every failed test, and a
// summary. It exits 1 when a test or a package failed; `make test` also fails
// on go test's own exit status (pipefail), which covers build errors.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

type key struct{ pkg, test string }

type report struct {
	mu       sync.Mutex
	out      io.Writer
	start    time.Time
	lastLine time.Time
	running  map[key]time.Time
	output   map[key]*strings.Builder
	passed   int
	skipped  int
	failed   []string
	pkgsOK   int
	pkgsFail []string
}

func main() {
	r := &report{out: os.Stdout, start: time.Now(), lastLine: time.Now(),
		running: map[key]time.Time{}, output: map[key]*strings.Builder{}}
	stop := make(chan struct{})
	go r.heartbeat(stop)
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		r.line(sc.Bytes())
	}
	close(stop)
	os.Exit(r.summary())
}

func short(pkg string) string {
	if i := strings.Index(pkg, "/ffreconcile/"); i >= 0 {
		return pkg[i+len("/ffreconcile/"):]
	}
	return pkg
}

func (r *report) printf(format string, a ...any) {
	fmt.Fprintf(r.out, format, a...)
	r.lastLine = time.Now()
}

func (r *report) line(b []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var e event
	if len(b) == 0 || b[0] != '{' || json.Unmarshal(b, &e) != nil {
		// go test's own lines (build errors go to stderr, which make
		// shows as is); its exit status, not this, decides.
		r.printf("%s\n", b)
		return
	}
	k := key{e.Package, e.Test}
	switch e.Action {
	case "run":
		if e.Test != "" {
			r.running[k] = time.Now()
			r.output[k] = &strings.Builder{}
		}
	case "output":
		// A test's lines also go to its parents, so a failed parent shows
		// its failed subtests' logs; lines outside any test (a build error,
		// a panic, TestMain) go to the package.
		if e.Test == "" {
			if r.output[k] == nil {
				r.output[k] = &strings.Builder{}
			}
			r.output[k].WriteString(e.Output)
			return
		}
		for t := e.Test; ; {
			if sb := r.output[key{e.Package, t}]; sb != nil {
				sb.WriteString(e.Output)
			}
			i := strings.LastIndex(t, "/")
			if i < 0 {
				break
			}
			t = t[:i]
		}
	case "pass", "fail", "skip":
		if e.Test == "" {
			r.endPackage(e)
			return
		}
		delete(r.running, k)
		top := !strings.Contains(e.Test, "/")
		switch {
		case e.Action == "fail":
			r.failed = append(r.failed, short(e.Package)+" "+e.Test)
			if top {
				r.printf("--- FAIL %s %s (%.1fs)\n%s", short(e.Package), e.Test, e.Elapsed, indent(r.output[k].String()))
			}
		case top && e.Action == "pass":
			r.passed++
			r.printf("    ok   %-22s %s (%.1fs)\n", short(e.Package), e.Test, e.Elapsed)
		case top:
			r.skipped++
			r.printf("    skip %-22s %s: %s\n", short(e.Package), e.Test, skipReason(r.output[k].String()))
		}
		if top {
			for kk := range r.output {
				if kk.pkg == e.Package && (kk.test == e.Test || strings.HasPrefix(kk.test, e.Test+"/")) {
					delete(r.output, kk)
				}
			}
		}
	}
}

func (r *report) endPackage(e event) {
	switch e.Action {
	case "fail":
		r.pkgsFail = append(r.pkgsFail, short(e.Package))
		r.printf("FAIL     %s (%.1fs)\n", short(e.Package), e.Elapsed)
		if sb := r.output[key{e.Package, ""}]; sb != nil {
			r.printf("%s", indent(sb.String()))
		}
	case "pass":
		r.pkgsOK++
		r.printf("ok       %s (%.1fs)\n", short(e.Package), e.Elapsed)
	}
	delete(r.output, key{e.Package, ""})
}

// heartbeat names the longest-running tests when nothing was printed for
// 30 s, so a silent stretch is never a mystery.
func (r *report) heartbeat(stop <-chan struct{}) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		r.mu.Lock()
		if time.Since(r.lastLine) >= 30*time.Second && len(r.running) > 0 {
			type run struct {
				name string
				d    time.Duration
			}
			var runs []run
			for k, at := range r.running {
				if !strings.Contains(k.test, "/") {
					runs = append(runs, run{short(k.pkg) + " " + k.test, time.Since(at)})
				}
			}
			slices.SortFunc(runs, func(a, b run) int { return int(b.d - a.d) })
			var names []string
			for i, x := range runs {
				if i == 4 {
					names = append(names, fmt.Sprintf("%d more", len(runs)-4))
					break
				}
				names = append(names, fmt.Sprintf("%s %.0fs", x.name, x.d.Seconds()))
			}
			r.printf("    ...  %.0fs in; running: %s\n", time.Since(r.start).Seconds(), strings.Join(names, ", "))
		}
		r.mu.Unlock()
	}
}

func (r *report) summary() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	fmt.Fprintf(r.out, "\n%d packages ok, %d failed; %d tests passed, %d skipped, %d failed; %.0fs\n",
		r.pkgsOK, len(r.pkgsFail), r.passed, r.skipped, len(r.failed), time.Since(r.start).Seconds())
	for _, f := range r.failed {
		fmt.Fprintf(r.out, "  failed: %s\n", f)
	}
	if len(r.failed) > 0 || len(r.pkgsFail) > 0 {
		return 1
	}
	return 0
}

func indent(s string) string {
	if s == "" {
		return ""
	}
	lines := strings.SplitAfter(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = "        " + l
	}
	return strings.Join(lines, "") + "\n"
}

// skipReason is the last line a skipped test logged (its t.Skip message).
func skipReason(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if l != "" && !strings.HasPrefix(l, "---") && !strings.HasPrefix(l, "===") {
			return l
		}
	}
	return "skipped"
}
