// Command worker runs the FlowFabric reconciler fleet on River.
//
//	worker migrate [--ff-schema]   create River's tables (and the ff_* tables)
//	worker run                     run the reconcilers, River UI and health endpoints
//	worker promote                 enqueue an ad-hoc delayed promotion
//	worker status                  due rows, River queues, leader, heartbeats
//	worker demo                    feed a demo workload into the ff_* tables
//	worker lease-history           print or follow the lease event stream
//	worker bench                   benchmark against the seed's design
//
// Every flag also reads an environment variable; `worker <command> --help`
// lists them.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer, logger *slog.Logger) error
}

func commands() []command {
	return []command{
		{"run", "run the reconcilers as River workers, with River UI and health endpoints", runCommand},
		{"migrate", "create River's tables and, with --ff-schema, FlowFabric's ff_* tables", migrateCommand},
		{"bench", "benchmark the fleet against the seed's design (throughput, lateness, idle cost, scale)", benchCommand},
		{"lease-history", "print (or --follow) lease events from ff_lease_event", leaseHistoryCommand},
		{"promote", "enqueue an ad-hoc delayed promotion", promoteCommand},
		{"status", "show due rows, River queues, the leader and worker heartbeats", statusCommand},
		{"demo", "feed a demo workload of every reconciler's rows into the ff_* tables", demoCommand},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := mainWithExit(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// mainWithExit runs one command and returns the process exit code: 0 on
// success, 1 on failure (reported as one line on stderr), 2 on bad usage.
func mainWithExit(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		// No command is a usage error, as an unknown one is.
		usage(stderr)
		return 2
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout)
		return 0
	}
	name := args[0]
	for _, c := range commands() {
		if c.name != name {
			continue
		}
		logger, rest, err := loggerFromArgs(args[1:], stderr)
		if err != nil {
			fmt.Fprintf(stderr, "worker %s: %v\n", name, err)
			return 2
		}
		err = c.run(ctx, rest, stdout, stderr, logger)
		switch {
		case err == nil, errors.Is(err, errHelp):
			return 0
		case errors.Is(err, errUsage):
			fmt.Fprintf(stderr, "worker %s: %v\n", name, oneLine(err))
			return 2
		default:
			fmt.Fprintf(stderr, "worker %s: %v\n", name, oneLine(err))
			return 1
		}
	}
	fmt.Fprintf(stderr, "worker: unknown command %q (commands: %s; see `worker --help`)\n", name, commandNames())
	return 2
}

// errUsage marks errors caused by bad flags or values (exit code 2).
var errUsage = errors.New("usage")

type usageError struct{ err error }

func (u usageError) Error() string        { return u.err.Error() }
func (u usageError) Is(target error) bool { return target == errUsage }
func (u usageError) Unwrap() error        { return u.err }

func badUsage(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

// oneLine keeps the error on one line, as promised to users and log scrapers.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

func commandNames() string {
	var names []string
	for _, c := range commands() {
		names = append(names, c.name)
	}
	return strings.Join(names, ", ")
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "Usage: worker <command> [flags]\n\nFlowFabric reconcilers as a River worker fleet.\n\nCommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-14s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun `worker <command> --help` for its flags and environment variables.")
}

// loggerFromArgs extracts the logging flags shared by every command
// (--log-format, --log-level and their environment variables) and returns
// the remaining args.
func loggerFromArgs(args []string, stderr io.Writer) (*slog.Logger, []string, error) {
	format := envOr("FF_LOG_FORMAT", "text")
	level := envOr("FF_LOG_LEVEL", "info")
	var rest []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		consumed := false
		for _, name := range []string{"log-format", "log-level"} {
			val, ok := "", false
			for _, p := range []string{"-" + name, "--" + name} {
				if v, found := strings.CutPrefix(a, p+"="); found {
					val, ok = v, true
				} else if a == p {
					if i+1 >= len(args) {
						return nil, nil, badUsage("flag --%s needs a value", name)
					}
					i++
					val, ok = args[i], true
				}
			}
			if ok {
				if name == "log-format" {
					format = val
				} else {
					level = val
				}
				consumed = true
				break
			}
		}
		if !consumed {
			rest = append(rest, a)
		}
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, nil, badUsage("log level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(stderr, opts)), rest, nil
	case "json":
		return slog.New(slog.NewJSONHandler(stderr, opts)), rest, nil
	}
	return nil, nil, badUsage("log format %q: want text or json", format)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// logFlagsHelp is appended to every command's --help.
const logFlagsHelp = "  --log-format\tFF_LOG_FORMAT\ttext or json (default text)\n" +
	"  --log-level\tFF_LOG_LEVEL\tdebug, info, warn or error (default info)\n"
