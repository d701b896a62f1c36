/*
 * Async events: ibv_get_async_event on each open NIC. Without them a device that dies
 * (IBV_EVENT_DEVICE_FATAL, e.g. removed or reset) leaves the CQs silent and test() would wait
 * forever. Handling an event only sets flags the data path reads when a caller waits
 * (mpib_p2p.c comm_health): fatal fails every comm on the device, a port that goes down stops
 * being scheduled while the other rail can carry the traffic, and a GID table change (an
 * address added or removed) makes the next connect read the table again. Each kind of event
 * is logged the first time it happens (and then counted), not per event.
 * No thread waits here: the Go control plane (plugin/events.go) waits on each NIC's async fd
 * in the Go runtime's netpoller, which already has a thread blocked in epoll for its sockets
 * (net_ib runs one thread per device), and calls mpib_events_drain when the fd is readable.
 * Called by mpib_device.c (a NIC is watched from when it opens until the NICs close) and by
 * the control plane; offers what mpib_events.h declares.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>

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

/* The NICs being watched. mu orders a drain against forget_all: a drain reads a context
 * only while holding mu and seeing its NIC watched, so once forget_all returns no drain reads
 * one (the contexts may close). */
static struct {
  pthread_mutex_t mu;
  int watched[MPIB_MAX_NICS];
} ev = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* The kernel closed the NIC's event queue (the device is gone): the same as a fatal event.
 * Called with ev.mu held. */
static void channel_closed_locked(int nic, int err) {
  struct mpib_nic *d = &mpib_g.nic[nic];
  __atomic_store_n(&d->fatal, 1, __ATOMIC_RELEASE);
  MPIB_WARN("%s rail: device %s went away (event channel closed: %s)", mpib_rail_name(d->role), d->name, strerror(err));
  ev.watched[nic] = 0;
}

int mpib_events_prepare(int nic) {
  if (nic < 0 || nic >= MPIB_MAX_NICS || mpib_g.nic[nic].ctx == NULL) return -EINVAL;
  int fd = mpib_g.nic[nic].ctx->async_fd;
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) return -errno;
  memset(event_counts[nic], 0, sizeof event_counts[nic]);
  pthread_mutex_lock(&ev.mu);
  ev.watched[nic] = 1;
  pthread_mutex_unlock(&ev.mu);
  return fd;
}

/* The kernel's read of an async fd (uverbs ib_uverbs_event_read) returns an event while one is
 * queued, then EIO once the queue is closed (the device was removed or disassociated; poll
 * reports EPOLLERR then, which wakes the waiter), else EAGAIN (the fd is non-blocking).
 * libibverbs passes read's errno through. */
int mpib_events_drain(int nic) {
  if (nic < 0 || nic >= MPIB_MAX_NICS) return MPIB_EVENTS_STOPPED;
  pthread_mutex_lock(&ev.mu);
  int rc = MPIB_EVENTS_STOPPED;
  while (ev.watched[nic]) {
    struct ibv_async_event e;
    errno = 0;
    if (ibv_get_async_event(mpib_g.nic[nic].ctx, &e) == 0) {
      handle_event(nic, &e);
      ibv_ack_async_event(&e);
      continue;
    }
    int err = errno;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) {
      rc = MPIB_EVENTS_WAIT;
      break;
    }
    channel_closed_locked(nic, err ? err : EIO); /* a short read without errno: not an event queue either */
    rc = MPIB_EVENTS_CLOSED;
  }
  pthread_mutex_unlock(&ev.mu);
  return rc;
}

void mpib_events_forget_all(void) {
  pthread_mutex_lock(&ev.mu);
  memset(ev.watched, 0, sizeof ev.watched);
  pthread_mutex_unlock(&ev.mu);
}
