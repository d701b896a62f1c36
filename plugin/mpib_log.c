/* One log stream: C's messages and Go's (mpib_log_str) go through the logger NCCL hands to
 * init (mpib_log_set, from abi_common.c). Called by every C file through MPIB_WARN and
 * MPIB_INFO and by the Go control plane; offers what mpib_log.h declares. */
#include "mpib_log.h"

#include <stdarg.h>
#include <stdio.h>

static ncclDebugLogger_t mpib_logger;

void mpib_log_set(ncclDebugLogger_t logger) { mpib_logger = logger; }

void mpib_log(ncclDebugLogLevel level, const char *file, int line, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (mpib_logger) {
    mpib_logger(level, NCCL_NET, file, line, "NET/MPIB : %s", msg);
  } else if (level == NCCL_LOG_WARN) {
    /* No logger yet (init not called): warnings still reach the user. */
    fprintf(stderr, "NET/MPIB WARN %s\n", msg);
  }
}

void mpib_log_str(int level, const char *msg) { mpib_log((ncclDebugLogLevel)level, "plugin.go", 0, "%s", msg); }
