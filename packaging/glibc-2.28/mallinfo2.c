/*
 * mallinfo2 for mpib-nettest built against the glibc 2.28 baseline (internal/dist).
 *
 * mallinfo2 arrived in glibc 2.33; RHEL 8 has 2.28. The release build compiles nettest with
 * -Dmallinfo2=mpib_compat_mallinfo2, which renames glibc's declaration (struct and function)
 * and every call alike, so calls land here: the running glibc's own mallinfo2 when it has
 * one, else mallinfo's figures, which are int and wrap past 2 GiB (a leak report's figure,
 * never a decision of the plugin).
 */
#define _GNU_SOURCE /* RTLD_DEFAULT */
#include <dlfcn.h>
#include <malloc.h>

#pragma GCC diagnostic ignored "-Wdeprecated-declarations" /* mallinfo: the fallback */

struct mallinfo2 mallinfo2(void) {
  struct mallinfo2 (*real)(void) = (struct mallinfo2 (*)(void))dlsym(RTLD_DEFAULT, "mallinfo2");
  if (real) return real();
  struct mallinfo old = mallinfo();
  struct mallinfo2 mi = {
      .arena = (unsigned)old.arena,
      .ordblks = (unsigned)old.ordblks,
      .smblks = (unsigned)old.smblks,
      .hblks = (unsigned)old.hblks,
      .hblkhd = (unsigned)old.hblkhd,
      .usmblks = (unsigned)old.usmblks,
      .fsmblks = (unsigned)old.fsmblks,
      .uordblks = (unsigned)old.uordblks,
      .fordblks = (unsigned)old.fordblks,
      .keepcost = (unsigned)old.keepcost,
  };
  return mi;
}
