/*
 * sniff: count the RoCE v2 packets (UDP destination port 4791) on one network interface per
 * IPv4 TOS byte, separately for the packets this host sends and those it receives. No plugin
 * is loaded. Used by the lab to check which traffic class the plugin puts on each rail:
 *
 *   mpib-nettest --mode sniff --iface IF [--seconds S] [--max-packets N] [--port P]
 *
 * prints one line and exits 0 (2 on a usage or socket error):
 *
 *   sniff: iface=IF seconds=S packets=N tx_packets=N rx_packets=N tos=T:N,... tx_tos=T:N,...
 *          rx_tos=T:N,... tx_dominant_tos=T rx_dominant_tos=T
 *
 * (one line; "none" for an empty histogram and -1 for no dominant value). An AF_PACKET raw
 * socket needs CAP_NET_RAW.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "nt_modes.h"
#include "nt_util.h"

#define NT_ROCEV2_PORT 4791

struct nt_sniff {
  const char *iface;
  double seconds;
  uint64_t max_packets;
  int port;
  uint64_t tos[2][256]; /* [0] received, [1] sent */
  uint64_t packets[2];
};

/* 1 when --mode sniff (or --mode=sniff) is on the command line: main hands over to us. */
int nt_sniff_wanted(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--mode=sniff") == 0 ||
        (strcmp(argv[i], "--mode") == 0 && i + 1 < argc && strcmp(argv[i + 1], "sniff") == 0)) {
      return 1;
    }
  }
  return 0;
}

static int nt_sniff_args(int argc, char **argv, struct nt_sniff *s) {
  s->seconds = 5;
  s->port = NT_ROCEV2_PORT;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    char *end = NULL;
    if (strcmp(a, "--mode=sniff") == 0) {
      continue;
    }
    if (v == NULL) {
      nt_err("sniff: option %s needs a value (or is unknown)", a);
      return -1;
    }
    i++;
    if (strcmp(a, "--mode") == 0) {
      continue;
    } else if (strcmp(a, "--iface") == 0) {
      s->iface = v;
    } else if (strcmp(a, "--seconds") == 0) {
      s->seconds = strtod(v, &end);
      if (*end != '\0' || !(s->seconds > 0) || s->seconds > 3600) {
        nt_err("sniff: bad --seconds '%s'", v);
        return -1;
      }
    } else if (strcmp(a, "--max-packets") == 0) {
      s->max_packets = strtoull(v, &end, 10);
      if (*end != '\0' || v[0] == '-') {
        nt_err("sniff: bad --max-packets '%s'", v);
        return -1;
      }
    } else if (strcmp(a, "--port") == 0) {
      s->port = (int)strtol(v, &end, 10);
      if (*end != '\0' || s->port <= 0 || s->port > 65535) {
        nt_err("sniff: bad --port '%s'", v);
        return -1;
      }
    } else {
      nt_err("sniff: unknown option '%s' (sniff takes --iface, --seconds, --max-packets, --port)", a);
      return -1;
    }
  }
  if (s->iface == NULL) {
    nt_err("sniff: --iface IF is required");
    return -1;
  }
  return 0;
}

/* The TOS byte of an IPv4 UDP packet to the port, or -1. Skips 802.1Q/802.1ad tags. */
static int nt_sniff_tos(const uint8_t *p, size_t len, int port) {
  size_t off = 12;
  if (len < off + 2) {
    return -1;
  }
  uint16_t et = (uint16_t)(p[off] << 8 | p[off + 1]);
  while ((et == ETH_P_8021Q || et == ETH_P_8021AD) && len >= off + 6) {
    off += 4;
    et = (uint16_t)(p[off] << 8 | p[off + 1]);
  }
  off += 2;
  if (et != ETH_P_IP || len < off + 20) {
    return -1;
  }
  const uint8_t *ip = p + off;
  size_t ihl = (size_t)(ip[0] & 0x0f) * 4;
  if ((ip[0] >> 4) != 4 || ihl < 20 || ip[9] != IPPROTO_UDP || len < off + ihl + 4) {
    return -1;
  }
  if ((((uint16_t)ip[6] << 8 | ip[7]) & 0x1fff) != 0) {
    return -1; /* a later fragment has no UDP header */
  }
  const uint8_t *udp = ip + ihl;
  if (((int)udp[2] << 8 | udp[3]) != port) {
    return -1;
  }
  return ip[1];
}

static void nt_sniff_hist(const uint64_t *h, char *buf, size_t len, int *dominant) {
  int off = 0, best = -1;
  buf[0] = '\0';
  for (int t = 0; t < 256; t++) {
    if (h[t] == 0) {
      continue;
    }
    if (best < 0 || h[t] > h[best]) {
      best = t;
    }
    if (off < (int)len - 32) {
      off += snprintf(buf + off, len - (size_t)off, "%s%d:%llu", off ? "," : "", t, (unsigned long long)h[t]);
    }
  }
  if (off == 0) {
    snprintf(buf, len, "none");
  }
  *dominant = best;
}

static int nt_sniff_open(const char *iface) {
  unsigned idx = if_nametoindex(iface);
  if (idx == 0) {
    nt_err("sniff: no interface '%s': %s", iface, strerror(errno));
    return -1;
  }
  int fd = socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, htons(ETH_P_ALL));
  if (fd < 0) {
    nt_err("sniff: AF_PACKET socket: %s (needs CAP_NET_RAW)", strerror(errno));
    return -1;
  }
  struct sockaddr_ll sll = {.sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_ALL), .sll_ifindex = (int)idx};
  if (bind(fd, (struct sockaddr *)&sll, sizeof(sll)) != 0) {
    nt_err("sniff: bind to %s: %s", iface, strerror(errno));
    close(fd);
    return -1;
  }
  return fd;
}

static void nt_sniff_loop(int fd, struct nt_sniff *s) {
  uint8_t buf[256]; /* headers only: the rest of a packet is truncated away */
  double deadline = nt_now() + s->seconds;
  while (nt_now() < deadline && (s->max_packets == 0 || s->packets[0] + s->packets[1] < s->max_packets)) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int ms = (int)((deadline - nt_now()) * 1000) + 1;
    if (poll(&p, 1, ms > 200 ? 200 : ms) <= 0) {
      continue;
    }
    struct sockaddr_ll from;
    socklen_t fl = sizeof(from);
    ssize_t n = recvfrom(fd, buf, sizeof(buf), MSG_DONTWAIT, (struct sockaddr *)&from, &fl);
    if (n <= 0) {
      continue;
    }
    int tos = nt_sniff_tos(buf, (size_t)n, s->port);
    if (tos < 0) {
      continue;
    }
    int dir = from.sll_pkttype == PACKET_OUTGOING;
    s->tos[dir][tos]++;
    s->packets[dir]++;
  }
}

int nt_sniff_main(int argc, char **argv) {
  static struct nt_sniff s;
  if (nt_sniff_args(argc, argv, &s) != 0) {
    return NT_EXIT_USAGE;
  }
  int fd = nt_sniff_open(s.iface);
  if (fd < 0) {
    return NT_EXIT_USAGE;
  }
  double t0 = nt_now();
  nt_sniff_loop(fd, &s);
  close(fd);
  uint64_t all[256];
  for (int t = 0; t < 256; t++) {
    all[t] = s.tos[0][t] + s.tos[1][t];
  }
  char h[2048], tx[1024], rx[1024];
  int dom, txdom, rxdom;
  nt_sniff_hist(all, h, sizeof(h), &dom);
  nt_sniff_hist(s.tos[1], tx, sizeof(tx), &txdom);
  nt_sniff_hist(s.tos[0], rx, sizeof(rx), &rxdom);
  nt_out("sniff: iface=%s seconds=%.3f packets=%llu tx_packets=%llu rx_packets=%llu tos=%s tx_tos=%s rx_tos=%s "
         "tx_dominant_tos=%d rx_dominant_tos=%d",
         s.iface, nt_now() - t0, (unsigned long long)(s.packets[0] + s.packets[1]), (unsigned long long)s.packets[1],
         (unsigned long long)s.packets[0], h, tx, rx, txdom, rxdom);
  return NT_EXIT_OK;
}
