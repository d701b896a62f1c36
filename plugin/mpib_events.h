/* Async events (mpib_events.c): no thread of their own. mpib_device.c has a NIC watched when
 * it opens it (mpib_events_prepare) and forgets every NIC before it closes them; the Go
 * control plane (plugin/events.go) waits on each watched NIC's async fd in its netpoller and
 * calls mpib_events_drain when the fd is readable. Handling an event sets the NICs' fatal,
 * port_down and gid_gen fields (struct mpib_nic), which the data path and the control plane
 * read. */
#ifndef MPIB_EVENTS_H
#define MPIB_EVENTS_H

#include "mpib.h"

/* mpib_events_drain's answers. */
enum {
  MPIB_EVENTS_WAIT = 0,    /* every queued event was handled: wait for the fd to be readable again */
  MPIB_EVENTS_CLOSED = 1,  /* the kernel closed the event queue (device gone): the NIC is fatal, no longer watched */
  MPIB_EVENTS_STOPPED = 2, /* the NIC is not watched (mpib_events_forget_all, or never): stop waiting */
};

/* Makes an open NIC's async fd non-blocking, resets its event counts and watches it. Returns
 * the fd (libibverbs' own: the caller may dup it, never close it) or -errno. */
int mpib_events_prepare(int nic);
/* Handles every event queued on a watched NIC without blocking (the waiter's epoll is
 * edge-triggered: it reads until the kernel has nothing more). Returns MPIB_EVENTS_*. */
int mpib_events_drain(int nic);
/* Stops watching every NIC; once it returns no drain reads any context (the caller may close
 * them). A drain after it answers MPIB_EVENTS_STOPPED. */
void mpib_events_forget_all(void);

#endif
