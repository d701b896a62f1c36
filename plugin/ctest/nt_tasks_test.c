//go:build ignore
// link: ../nettest/util.c

/* mpib-nettest's account of which threads switched during a connect setup (nettest/util.c:
 * nt_tasks_read, nt_tasks_change), which its connect-phases: line prints as
 * setup_ctxsw_caller, setup_ctxsw_busiest and setup_threads_new. */
#define _GNU_SOURCE
#include <pthread.h>
#include <unistd.h>

#include "../nettest/nt_util.h"
#include "check.h"

static struct nt_tasks tasks(int n, const int *tid, const long *ctxsw) {
  struct nt_tasks t = {.n = n};
  for (int i = 0; i < n; i++) {
    t.tid[i] = tid[i];
    t.ctxsw[i] = ctxsw[i];
  }
  return t;
}

static void change_cases(void) {
  struct nt_tasks_change c;
  /* Thread 10 (the caller) switched 5 times, 11 four times, and 12 appeared with 7. */
  struct nt_tasks a = tasks(2, (int[]){10, 11}, (long[]){100, 40});
  struct nt_tasks b = tasks(3, (int[]){11, 12, 10}, (long[]){44, 7, 105});
  nt_tasks_change(&a, &b, 10, &c);
  CHECK(c.created == 1 && c.caller == 5 && c.busiest == 7, "created=%d caller=%ld busiest=%ld", c.created, c.caller,
        c.busiest);
  /* A thread that ended (11) is in neither figure; the caller is not the busiest one. */
  b = tasks(2, (int[]){10, 13}, (long[]){190, 2});
  nt_tasks_change(&a, &b, 10, &c);
  CHECK(c.created == 1 && c.caller == 90 && c.busiest == 2, "ended: created=%d caller=%ld busiest=%ld", c.created,
        c.caller, c.busiest);
  /* Nothing changed, and a caller absent from both readings counts nothing. */
  nt_tasks_change(&a, &a, 99, &c);
  CHECK(c.created == 0 && c.caller == 0 && c.busiest == 0, "same: created=%d caller=%ld busiest=%ld", c.created,
        c.caller, c.busiest);
}

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int release;

static void *waiter(void *arg) {
  (void)arg;
  pthread_mutex_lock(&mu);
  while (!release) pthread_cond_wait(&cv, &mu);
  pthread_mutex_unlock(&mu);
  return NULL;
}

/* The readings of this process: a thread started between two of them is created, and this
 * thread's own sleeps count as its switches. */
static void read_cases(void) {
  struct nt_tasks a, b;
  struct nt_tasks_change c;
  CHECK(nt_tasks_read(&a) == 0 && a.n >= 1, "first reading: n=%d", a.n);
  pthread_t th;
  CHECK(pthread_create(&th, NULL, waiter, NULL) == 0, "pthread_create");
  for (int i = 0; i < 3; i++) usleep(1000);
  CHECK(nt_tasks_read(&b) == 0 && b.n == a.n + 1, "second reading: n=%d, want %d", b.n, a.n + 1);
  nt_tasks_change(&a, &b, nt_gettid(), &c);
  CHECK(c.created == 1, "created=%d, want 1", c.created);
  CHECK(c.caller >= 3, "caller=%ld: three sleeps are three switches", c.caller);
  pthread_mutex_lock(&mu);
  release = 1;
  pthread_cond_signal(&cv);
  pthread_mutex_unlock(&mu);
  pthread_join(th, NULL);
}

int main(void) {
  change_cases();
  read_cases();
  return failures != 0;
}
