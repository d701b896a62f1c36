//go:build ignore

// Bootstrap so that `go run mage.go TARGET` works without installing mage.
package main

import (
	"os"

	"github.com/magefile/mage/mage"
)

func main() { os.Exit(mage.Main()) }
