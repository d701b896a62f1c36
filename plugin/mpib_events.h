/* Async events (mpib_events.c): one thread per open NIC. mpib_device.c starts a NIC's thread
 * when it opens the NIC and stops it when it closes the NICs; the thread sets the NIC's fatal,
 * port_down and gid_gen fields (struct mpib_nic), which the data path and the control plane
 * read. Return 0 or -errno. */
#ifndef MPIB_EVENTS_H
#define MPIB_EVENTS_H

#include "mpib.h"

int mpib_events_start(int nic);
void mpib_events_stop(int nic);

#endif
