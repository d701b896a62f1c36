/* One log stream: C and Go both write through the logger NCCL hands to init. */
#ifndef MPIB_LOG_H
#define MPIB_LOG_H

#include "nccl_abi.h"

void mpib_log_set(ncclDebugLogger_t logger);
void mpib_log(ncclDebugLogLevel level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* For Go: a preformatted message. */
void mpib_log_str(int level, const char *msg);

#define MPIB_WARN(...) mpib_log(NCCL_LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define MPIB_INFO(...) mpib_log(NCCL_LOG_INFO, __FILE__, __LINE__, __VA_ARGS__)
#ifdef MPIB_TRACE_ENABLED
#define MPIB_TRACE(...) mpib_log(NCCL_LOG_TRACE, __FILE__, __LINE__, __VA_ARGS__)
#else
#define MPIB_TRACE(...) ((void)0)
#endif

#endif
