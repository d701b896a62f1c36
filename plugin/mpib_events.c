/*
 * Async events: one thread per open NIC reads ibv_get_async_event, as net_ib does.
 * Without it a device that dies (IBV_EVENT_DEVICE_FATAL, e.g. removed or reset) leaves the
 * CQs silent and test() would wait forever. The thread only sets flags the data path reads
 * when a caller waits (mpib_p2p.c comm_health): fatal fails every comm on the device, a port
 * that goes down stops being scheduled while the other rail can carry the traffic, and a GID
 * table change (an address added or removed) makes the next connect read the table again.
 * Each kind of event is logged the first time it happens (and then counted), not per event.
 * Called by mpib_device.c (a NIC's thread starts when it opens, stops before it closes);
 * offers what mpib_events.h declares.
 */
#define _GNU_SOURCE /* pipe2 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <unistd.h>

#include "mpib.h"
#include "mpib_clock.h"
#include "mpib_events.h"

/* Events per type seen on each NIC; a type is logged when its count goes 0 -> 1. */
static unsigned event_counts[MPIB_MAX_NICS][32];

static int first_time(int nic, enum ibv_event_type t) {
  unsigned i = (unsigned)t < 32 ? (unsigned)t : 31;
  return __atomic_fetch_add(&event_counts[nic][i], 1, __ATOMIC_RELAXED) == 0;
}

/* A port opened down (a mesh device's unplugged cable, mpib_nic_open) reported no real MTU:
 * read it again when the port comes up, before connections may use it. */
static void refresh_mtu(struct mpib_nic *d) {
  struct ibv_port_attr pa;
  if (ibv_query_port(d->ctx, d->port, &pa) == 0 && pa.active_mtu >= IBV_MTU_256 && pa.active_mtu <= IBV_MTU_4096)
    __atomic_store_n(&d->active_mtu, pa.active_mtu, __ATOMIC_RELAXED);
}

static void handle_event(int nic, const struct ibv_async_event *ev) {
  struct mpib_nic *d = &mpib_g.nic[nic];
  int rail = d->role;
  enum ibv_event_type t = ev->event_type;
  switch (t) {
  case IBV_EVENT_DEVICE_FATAL:
    __atomic_store_n(&d->fatal, 1, __ATOMIC_RELEASE);
    MPIB_WARN("%s rail: device %s reported a fatal error (removed or reset): its connections move to the other rail "
              "where they can, and fail where they cannot",
              mpib_rail_name(rail), d->name);
    return;
  case IBV_EVENT_PORT_ERR:
  case IBV_EVENT_PORT_ACTIVE:
    __atomic_store_n(&d->port_change_ns, mpib_now_ns(), __ATOMIC_RELAXED);
    if (t == IBV_EVENT_PORT_ACTIVE) refresh_mtu(d);
    __atomic_store_n(&d->port_down, t == IBV_EVENT_PORT_ERR, __ATOMIC_RELEASE);
    MPIB_INFO("%s rail: device %s port %d is %s", mpib_rail_name(rail), d->name, ev->element.port_num,
              t == IBV_EVENT_PORT_ERR ? "down: traffic moves to the other rail where it can" : "active again");
    return;
  case IBV_EVENT_GID_CHANGE: /* an address came or went: the next connect reads the GID table again */
    __atomic_add_fetch(&d->gid_gen, 1, __ATOMIC_RELEASE);
    if (first_time(nic, t))
      MPIB_INFO("%s rail: device %s port %d GID table changed (logged once; every change is acted on)",
                mpib_rail_name(rail), d->name, ev->element.port_num);
    return;
  case IBV_EVENT_COMM_EST:
  case IBV_EVENT_SQ_DRAINED:
  case IBV_EVENT_QP_LAST_WQE_REACHED:       /* an SRQ QP forced to the error state by a failover */
  case IBV_EVENT_SRQ_LIMIT_REACHED: return; /* expected in normal operation */
  default:
    if (first_time(nic, t))
      MPIB_WARN("%s rail: device %s async event: %s (logged once per kind)", mpib_rail_name(rail), d->name,
                ibv_event_type_str(t));
  }
}

static void *event_loop(void *arg) {
  int nic = (int)(intptr_t)arg;
  struct mpib_nic *d = &mpib_g.nic[nic];
  int rail = d->role;
  struct pollfd fds[2] = {{.fd = d->ctx->async_fd, .events = POLLIN}, {.fd = d->event_stop_pipe[0], .events = POLLIN}};
  for (;;) {
    int n = poll(fds, 2, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 || fds[1].revents) return NULL;
    if (fds[0].revents & (POLLERR | POLLHUP | POLLNVAL)) {
      /* The kernel dropped the device under us: the same as a fatal event. */
      __atomic_store_n(&d->fatal, 1, __ATOMIC_RELEASE);
      MPIB_WARN("%s rail: device %s went away (event channel closed)", mpib_rail_name(rail), d->name);
      return NULL;
    }
    struct ibv_async_event ev;
    while (ibv_get_async_event(d->ctx, &ev) == 0) { /* non-blocking: drain what is queued */
      handle_event(nic, &ev);
      ibv_ack_async_event(&ev);
    }
  }
}

int mpib_events_start(int nic) {
  struct mpib_nic *d = &mpib_g.nic[nic];
  int flags = fcntl(d->ctx->async_fd, F_GETFL);
  if (flags < 0 || fcntl(d->ctx->async_fd, F_SETFL, flags | O_NONBLOCK) < 0) return -errno;
  if (pipe2(d->event_stop_pipe, O_CLOEXEC) != 0) return -errno;
  memset(event_counts[nic], 0, sizeof event_counts[nic]);
  int rc = pthread_create(&d->event_thread, NULL, event_loop, (void *)(intptr_t)nic);
  if (rc != 0) {
    close(d->event_stop_pipe[0]);
    close(d->event_stop_pipe[1]);
    return -rc;
  }
  d->event_thread_running = 1;
  return 0;
}

void mpib_events_stop(int nic) {
  struct mpib_nic *d = &mpib_g.nic[nic];
  if (!d->event_thread_running) return;
  char b = 0;
  ssize_t w = write(d->event_stop_pipe[1], &b, 1);
  (void)w;
  pthread_join(d->event_thread, NULL);
  close(d->event_stop_pipe[0]);
  close(d->event_stop_pipe[1]);
  d->event_thread_running = 0;
}
