// Command stamped prints buildinfo.Line("stamped"): buildinfo_test builds it with LDFlags.
package main

import (
	"fmt"

	"github.com/mpib/mpib/internal/buildinfo"
)

func main() { fmt.Println(buildinfo.Line("stamped")) }
