package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"html"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

// defaultMaxPeers bounds the (dev, peer) pairs with series of their own. A node's fused devices
// (up to 16) talk to the peers of its NCCL rings and trees, a handful each; 64 pairs leave room
// for all-to-all jobs on small clusters and cap a node at 4151 series (docs/metrics.md).
const defaultMaxPeers = 64

// HTTP server limits: a scrape is one small response, so anything slow is a stuck client.
const (
	readHeaderTimeout = 5 * time.Second
	writeTimeout      = 30 * time.Second
	idleTimeout       = 2 * time.Minute
	shutdownTimeout   = 5 * time.Second
)

func cmdExport(args []string, out io.Writer) error {
	fs, path := newFlags("export")
	listen := fs.String("listen", defaultListen, "where to serve /metrics: HOST:PORT on loopback (127.0.0.1:0 a free port), or unix:PATH; another address needs --allow-remote")
	allowRemote := fs.Bool("allow-remote", false, "serve on an address other hosts can reach (the scrape is unauthenticated: docs/metrics.md)")
	maxPeersS := fs.String("max-peers", strconv.Itoa(defaultMaxPeers), "(dev, peer) pairs with series of their own; later ones are summed under peer=\"other\"")
	if err := parse(fs, args); err != nil {
		return err
	}
	network, address, err := listenTarget(*listen, *allowRemote)
	if err != nil {
		return err
	}
	maxPeers, err := parseInt("max-peers", *maxPeersS)
	if err != nil {
		return err
	}
	if maxPeers < 1 || maxPeers > 4096 {
		return usagef("--max-peers %d: want 1..4096", maxPeers)
	}
	ln, err := listenExport(network, address)
	if err != nil {
		return err
	}
	e := newExporter(*path, int(maxPeers))
	srv := &http.Server{Handler: e.handler(), ReadHeaderTimeout: readHeaderTimeout,
		WriteTimeout: writeTimeout, IdleTimeout: idleTimeout, MaxHeaderBytes: 16 << 10}
	// The address line comes first, so that a caller that asked for port 0 learns the port.
	if network == "unix" {
		fmt.Fprintf(out, "export: serving /metrics on %s%s from %s\n", unixPrefix, address, *path)
	} else {
		fmt.Fprintf(out, "export: serving http://%s/metrics from %s\n", ln.Addr(), *path)
	}
	return serveUntilSignal(srv, ln)
}

// serveUntilSignal serves until SIGINT or SIGTERM, then lets running scrapes finish.
func serveUntilSignal(srv *http.Server, ln net.Listener) error {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-sig:
	}
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		return err
	}
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// handler serves /metrics and a small index page at /; everything else is 404.
func (e *exporter) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", e.serveMetrics)
	mux.HandleFunc("GET /{$}", e.serveIndex)
	return mux
}

func (e *exporter) serveMetrics(w http.ResponseWriter, _ *http.Request) {
	res, changed := e.scrape()
	if changed {
		if res.err != nil {
			warn(fmt.Errorf("export: %s: %v", errorCode(res.err), res.err))
		} else {
			fmt.Fprintf(os.Stderr, "%s: export: segment %s readable again\n", prog, e.path)
		}
	}
	var buf bytes.Buffer
	if err := writeText(&buf, e.families(res)); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", textContentType)
	w.Write(buf.Bytes())
}

func (e *exporter) serveIndex(w http.ResponseWriter, _ *http.Request) {
	e.mu.Lock()
	status := "read at the last scrape"
	if e.lastErr != "" {
		status = "not readable at the last scrape: " + e.lastErr
	}
	e.mu.Unlock()
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	fmt.Fprintf(w, "<!doctype html><title>mpib-agent export</title><h1>mpib-agent export</h1>"+
		"<p>Segment %s: %s.</p><p><a href=\"/metrics\">/metrics</a> (docs/metrics.md)</p>\n",
		html.EscapeString(e.path), html.EscapeString(status))
}
