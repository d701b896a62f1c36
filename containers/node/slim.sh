#!/bin/sh
# Strips a node rootfs (argument: its directory) of what tests never use, so that
# `docker import` in the lab stays fast. Runs on the build host, not inside the rootfs.
set -eu
root=$1
rm -rf "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
	"$root"/usr/share/locale/* "$root"/usr/share/i18n/* "$root"/usr/share/zoneinfo/right \
	"$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/cache/debconf/*-old \
	"$root"/var/log/* "$root"/usr/share/lintian "$root"/usr/share/bug
# valgrind: keep the 64-bit tools only (the 32-bit x86 ones are half of its size), and
# drop the static libraries for building new tools.
rm -f "$root"/usr/libexec/valgrind/*-x86-linux "$root"/usr/libexec/valgrind/vgpreload_*-x86-linux.so \
	"$root"/usr/lib/x86_64-linux-gnu/valgrind/*.a
# udev's hardware database (pulled in by rdma-core): nodes have no hardware to name.
rm -rf "$root"/usr/lib/udev/hwdb.bin "$root"/usr/lib/udev/hwdb.d
find "$root"/usr/lib/python3* -name '__pycache__' -type d -prune -exec rm -rf {} + 2>/dev/null || true
# Mount points for the harness: the project's build/ is bind-mounted read-only here.
mkdir -p "$root"/opt/mpib
