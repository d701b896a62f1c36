/*
 * Async events: one thread for every open NIC of the process reads ibv_get_async_event
 * (net_ib runs one per device; one for all keeps a node with a NIC per GPU, and a SUP port
 * per neighbour, at one thread: events are rare, and each is handled in microseconds).
 * Without it a device that dies (IBV_EVENT_DEVICE_FATAL, e.g. removed or reset) leaves the
 * CQs silent and test() would wait forever. The thread only sets flags the data path reads
 * when a caller waits (mpib_p2p.c comm_health): fatal fails every comm on the device, a port
 * that goes down stops being scheduled while the other rail can carry the traffic, and a GID
 * table change (an address added or removed) makes the next connect read the table again.
 * Each kind of event is logged the first time it happens (and then counted), not per event.
 * Called by mpib_device.c (a NIC is watched from when it opens; the thread stops before the
 * NICs close); offers what mpib_events.h declares.
 */
#define _GNU_SOURCE /* pipe2 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
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

/* A port opened down (a mesh device's unplugged cable, mpib_nic_open) reported no real MTU, and
 * on InfiniBand no LID (the subnet manager gives one when the port comes up); the subnet
 * manager may also move a LID later. Read them again when the port comes up or its LID
 * changes, before connections (and the flush loopback, which addresses its own LID) use them. */
static void refresh_port(struct mpib_nic *d) {
  struct ibv_port_attr pa;
  if (ibv_query_port(d->ctx, d->port, &pa) != 0) return;
  if (pa.active_mtu >= IBV_MTU_256 && pa.active_mtu <= IBV_MTU_4096)
    __atomic_store_n(&d->active_mtu, pa.active_mtu, __ATOMIC_RELAXED);
  __atomic_store_n(&d->lid, pa.lid, __ATOMIC_RELAXED);
}

static void handle_event(int nic, const struct ibv_async_event *ev) {
  struct mpib_nic *d = &mpib_g.nic[nic];
  int rail = d->role;
  enum ibv_event_type t = ev->event_type;
  if (!mpib_event_for_port(t, ev->element.port_num, d->port)) return; /* another port of the device */
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
    if (t == IBV_EVENT_PORT_ACTIVE) refresh_port(d);
    __atomic_store_n(&d->port_down, t == IBV_EVENT_PORT_ERR, __ATOMIC_RELEASE);
    MPIB_INFO("%s rail: device %s port %d is %s", mpib_rail_name(rail), d->name, ev->element.port_num,
              t == IBV_EVENT_PORT_ERR ? "down: traffic moves to the other rail where it can" : "active again");
    return;
  case IBV_EVENT_LID_CHANGE:
  case IBV_EVENT_CLIENT_REREGISTER: /* the subnet manager (re)configured the port */
    refresh_port(d);
    if (first_time(nic, t))
      MPIB_INFO("%s rail: device %s port %d: %s, LID now %u (logged once; every change is acted on)",
                mpib_rail_name(rail), d->name, ev->element.port_num, ibv_event_type_str(t),
                (unsigned)__atomic_load_n(&d->lid, __ATOMIC_RELAXED));
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

/* The thread's state: which NICs it watches (set under mu; the thread reads the set afresh
 * when woken through the pipe) and whether it runs. */
static struct {
  pthread_mutex_t mu;
  int watched[MPIB_MAX_NICS];
  int pipe[2]; /* a byte: read the set again; the pipe's end closed: stop */
  pthread_t thread;
  int running;
} ev = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* The kernel dropped the device under us: the same as a fatal event. */
static void channel_closed(int nic) {
  struct mpib_nic *d = &mpib_g.nic[nic];
  __atomic_store_n(&d->fatal, 1, __ATOMIC_RELEASE);
  MPIB_WARN("%s rail: device %s went away (event channel closed)", mpib_rail_name(d->role), d->name);
  pthread_mutex_lock(&ev.mu);
  ev.watched[nic] = 0;
  pthread_mutex_unlock(&ev.mu);
}

/* The poll set: the pipe first, then each watched NIC's async fd; nics[i] is fds[i + 1]'s NIC. */
static int poll_set(struct pollfd *fds, int *nics) {
  int n = 0;
  fds[0] = (struct pollfd){.fd = ev.pipe[0], .events = POLLIN};
  pthread_mutex_lock(&ev.mu);
  for (int nic = 0; nic < MPIB_MAX_NICS; nic++) {
    if (!ev.watched[nic]) continue;
    nics[n] = nic;
    fds[++n] = (struct pollfd){.fd = mpib_g.nic[nic].ctx->async_fd, .events = POLLIN};
  }
  pthread_mutex_unlock(&ev.mu);
  return n + 1;
}

/* Reads the wake-up bytes; 0 when the pipe's write end was closed (stop). */
static int drain_pipe(void) {
  char b[64];
  ssize_t n = read(ev.pipe[0], b, sizeof b);
  return n != 0;
}

static void *event_loop(void *arg) {
  (void)arg;
  struct pollfd fds[MPIB_MAX_NICS + 1];
  int nics[MPIB_MAX_NICS];
  int nfds = poll_set(fds, nics);
  for (;;) {
    int n = poll(fds, (nfds_t)nfds, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      MPIB_WARN("the NICs' event thread stopped (poll: %s): port and device events are no longer seen; a failed rail "
                "is still found by its connections' no-progress watch",
                strerror(errno));
      return NULL;
    }
    int reread = 0;
    if (fds[0].revents) {
      if (!drain_pipe()) return NULL;
      reread = 1;
    }
    for (int i = 1; i < nfds; i++) {
      if (!fds[i].revents) continue;
      if (fds[i].revents & (POLLERR | POLLHUP | POLLNVAL)) {
        channel_closed(nics[i - 1]);
        reread = 1;
        continue;
      }
      struct ibv_async_event e;
      while (ibv_get_async_event(mpib_g.nic[nics[i - 1]].ctx, &e) == 0) { /* non-blocking: drain what is queued */
        handle_event(nics[i - 1], &e);
        ibv_ack_async_event(&e);
      }
    }
    if (reread) nfds = poll_set(fds, nics);
  }
}

/* Starts the thread with its pipe; called with ev.mu held. */
static int start_thread_locked(void) {
  if (pipe2(ev.pipe, O_CLOEXEC | O_NONBLOCK) != 0) return -errno;
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old); /* inherited: process signals keep going to NCCL's threads */
  int rc = pthread_create(&ev.thread, NULL, event_loop, NULL);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) {
    close(ev.pipe[0]);
    close(ev.pipe[1]);
    return -rc;
  }
  ev.running = 1;
  return 0;
}

int mpib_events_start(int nic) {
  struct mpib_nic *d = &mpib_g.nic[nic];
  int flags = fcntl(d->ctx->async_fd, F_GETFL);
  if (flags < 0 || fcntl(d->ctx->async_fd, F_SETFL, flags | O_NONBLOCK) < 0) return -errno;
  memset(event_counts[nic], 0, sizeof event_counts[nic]);
  pthread_mutex_lock(&ev.mu);
  int rc = ev.running ? 0 : start_thread_locked();
  if (rc == 0) {
    ev.watched[nic] = 1;
    char b = 0;
    ssize_t w = write(ev.pipe[1], &b, 1); /* a full pipe already asks for a re-read */
    (void)w;
  }
  pthread_mutex_unlock(&ev.mu);
  return rc;
}

void mpib_events_stop(void) {
  pthread_mutex_lock(&ev.mu);
  int running = ev.running;
  ev.running = 0;
  memset(ev.watched, 0, sizeof ev.watched);
  if (running) close(ev.pipe[1]); /* the thread reads end-of-file and returns */
  pthread_mutex_unlock(&ev.mu);
  if (!running) return;
  pthread_join(ev.thread, NULL);
  close(ev.pipe[0]);
}
