// verbs_link.go: one link flag (-ldl) for mpib_verbs.c's optional verbs; no Go code.

package main

// mpib_verbs.c resolves optional verbs with dlopen/dlvsym. glibc 2.34 moved them into libc;
// a build host with an older glibc (Ubuntu 20.04, RHEL 8) finds them only in libdl. On Debian 12
// -ldl resolves to glibc's empty libdl.a stub, so the .so gains no NEEDED entry.

/*
#cgo LDFLAGS: -ldl
*/
import "C"
