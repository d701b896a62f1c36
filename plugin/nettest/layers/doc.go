// Package layers checks the structure of mpib-nettest (the C driver in plugin/nettest): its
// files are layered, and a file uses only its own functions and those of lower layers
// (layers_test.go holds the table; docs/nettest.md, "Sources").
package layers
