package main

import (
	"net"
	"net/netip"
	"os"
	"strings"
)

// defaultListen is where export serves unless --listen says otherwise: loopback only. A scrape
// is unauthenticated HTTP and publishes what the segment's 0600 mode protects from other users
// (peer addresses, per-peer rates, rail failures, NIC names, the segment path): a node's
// Prometheus agent scrapes it locally, or a proxy the operator secures forwards it.
const defaultListen = "127.0.0.1:9877"

// unixPrefix marks a Unix socket path in --listen (created mode 0600: the user alone).
const unixPrefix = "unix:"

// listenTarget turns --listen into what net.Listen takes, and refuses an address that other
// hosts can reach (any non-loopback IP, a host name other than localhost, or an empty host:
// every interface) unless allowRemote says the operator asked for it.
func listenTarget(listen string, allowRemote bool) (network, address string, err error) {
	if path, ok := strings.CutPrefix(listen, unixPrefix); ok {
		if path == "" {
			return "", "", usagef("--listen %s: give a socket path after %q", listen, unixPrefix)
		}
		return "unix", path, nil
	}
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return "", "", usagef("--listen %s: want HOST:PORT or unix:PATH (%v)", listen, err)
	}
	if !allowRemote && !isLoopbackHost(host) {
		return "", "", usagef("--listen %s can be reached from other hosts, and a scrape is unauthenticated "+
			"(peer addresses, per-peer rates, rail failures, NIC names, the segment path: docs/metrics.md): "+
			"serve on loopback (the default %s) or a unix: socket, or give --allow-remote to serve it anyway", listen, defaultListen)
	}
	return "tcp", listen, nil
}

// isLoopbackHost: localhost or a loopback IP; an empty host is every interface.
func isLoopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.Unmap().IsLoopback()
}

// listenExport opens the exporter's listener; a Unix socket is made readable by its owner only.
func listenExport(network, address string) (net.Listener, error) {
	ln, err := net.Listen(network, address)
	if err != nil || network != "unix" {
		return ln, err
	}
	if err := os.Chmod(address, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}
