/* Async events (mpib_events.c): one thread for every open NIC. mpib_device.c has a NIC
 * watched when it opens it (the thread starts with the first) and stops the thread before it
 * closes the NICs; the thread sets the NICs' fatal, port_down and gid_gen fields (struct
 * mpib_nic), which the data path and the control plane read. */
#ifndef MPIB_EVENTS_H
#define MPIB_EVENTS_H

#include "mpib.h"

/* Watches an open NIC's events, starting the thread if it is not running. 0 or -errno. */
int mpib_events_start(int nic);
/* Stops the thread and forgets every NIC; returns once the thread no longer reads any
 * context (the caller may close them). */
void mpib_events_stop(void);

#endif
