// Package ctest runs the plugin's pure-C unit tests (see ctest_test.go for the convention).
package ctest
