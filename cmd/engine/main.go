// Command engine is Reveille's single binary: the API server and its
// background workers (serve), a self-contained developer stack (dev), the
// bare infrastructure (devstack), migrations, dev tokens, the demo and the
// benchmarks. It reads the environment (config.go, once) and the flags and
// calls the package that does the work: internal/service builds and runs
// the service, internal/devstack/localstack the local stack, internal/demo
// and internal/bench the demo and the benchmarks.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
)

type command struct {
	name, summary string
	run           func(ctx context.Context, args []string) error
	// logsJSON: the command's stderr is a JSON log stream (startLogging),
	// so its failure is a JSON line too.
	logsJSON bool
}

func commands() []command {
	return []command{
		{"serve", "run the API and workers against external Postgres and Temporal (production)", runServe, true},
		{"dev", "run everything locally: Postgres cluster, embedded Temporal, API, workers", runDev, true},
		{"devstack", "run only the local Postgres cluster and embedded Temporal", runDevstack, true},
		{"migrate", "apply (up) or list (status) database migrations", runMigrate, false},
		{"token", "print a signed dev token", runToken, false},
		{"demo", "run the reference workflow six ways — a success, a failure, a cancel, a tool call approved and one denied by a human, a refused-then-approved spend — printing timelines", runDemo, false},
		{"load", "drive a running engine's REST API as an agent platform would and count the wake-ups lost", runLoad, false},
		{"bench", "run a benchmark: " + strings.Join(benchNames(), ", "), runBench, false},
		{"version", "print the version", runVersion, false},
	}
}

func runVersion(_ context.Context, args []string) error {
	// A flag set of no flags, so that --help prints the usage and exits 0
	// as every command's does, and an argument is refused as theirs are.
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	fs.Usage = func() { flagUsage(fs, "engine version", "") }
	if err := parseArgs(fs, args, 0); err != nil {
		return err
	}
	fmt.Println(buildVersion())
	return nil
}

func main() {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go stopOnSignal(stop)
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage()
		if len(os.Args) < 2 {
			os.Exit(2)
		}
		return
	}
	for _, c := range commands() {
		if c.name == os.Args[1] {
			err := c.run(ctx, os.Args[2:])
			if errors.Is(err, flag.ErrHelp) {
				return
			}
			if err != nil {
				reportFailure(c, err)
				os.Exit(1)
			}
			return
		}
	}
	fmt.Fprintf(os.Stderr, "engine: unknown command %q\n\n", os.Args[1])
	usage()
	os.Exit(2)
}

// stopOnSignal ends the command's context on the first SIGTERM or SIGINT —
// serve then drains within REVEILLE_SHUTDOWN_GRACE and exits 0 — and exits
// at once, with status 1, on a second: an operator who cannot wait for the
// drain is not made to reach for SIGKILL. The work this leaves running is
// recovered after the heartbeat timeout, as after a kill; a local Postgres
// that devstack or dev started keeps running and the next run reuses it.
func stopOnSignal(stop context.CancelFunc) {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	onSignals(sigs, stop, os.Exit)
}

// onSignals is stopOnSignal's work on sigs, logged through slog.Default:
// JSON lines for the commands that log JSON (startLogging).
func onSignals(sigs <-chan os.Signal, stop context.CancelFunc, exit func(int)) {
	sig := <-sigs
	slog.Info("stopping: send the signal again to exit at once", "signal", sig.String())
	stop()
	sig = <-sigs
	slog.Warn("signal again: exiting without waiting for the drain", "signal", sig.String())
	exit(1)
}

// reportFailure writes the error a command ended with to stderr: a JSON
// line for the commands whose stderr is a JSON log stream, else plain text.
func reportFailure(c command, err error) {
	if c.logsJSON {
		slog.New(slog.NewJSONHandler(stderr, nil)).Error("engine "+c.name+" failed", "error", err.Error())
		return
	}
	fmt.Fprintf(stderr, "engine %s: %v\n", c.name, err)
}

func usage() {
	fmt.Fprintln(os.Stderr, "Reveille — the agent wake-up engine\n\nUsage: engine <command> [flags]   (engine <command> --help for its flags)\n\nCommands:")
	for _, c := range commands() {
		fmt.Fprintf(os.Stderr, "  %-9s %s\n", c.name, c.summary)
	}
}

func benchNames() []string {
	names := make([]string, 0, len(benches))
	for n := range benches {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
