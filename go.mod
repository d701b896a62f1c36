module github.com/mpib/mpib

go 1.26.0

require github.com/magefile/mage v1.17.2

require golang.org/x/sys v0.49.0
