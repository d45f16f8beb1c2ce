/* logheap_tm.h: the TM pool of liblogheap_itm, the GNU TM runtime of logheap.
 *
 * Written by hand: its functions carry GCC's transactional-memory attributes
 * (transaction_pure), which cbindgen does not emit.
 *
 * Build:  gcc -fgnu-tm -c app.c -I crates/logheap-itm/include
 * Link:   gcc app.o -L<dir of liblogheap_itm.so> -llogheap_itm -pthread
 *         (without -fgnu-tm at the link, which would add GCC's -litm.) */

#ifndef LOGHEAP_TM_H
#define LOGHEAP_TM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) && !defined(__clang__)
#define LH_TM_PURE __attribute__((transaction_pure))
#else
#define LH_TM_PURE
#endif

/* Opens the pool at `path` (creating it with `engine`, "redo" (NULL) or "undo", and
 * `size` bytes, 0 for 64 MiB, when missing) as the process's TM pool, mapped at a
 * fixed address. 0, or -1 with the reason in lh_tm_errormsg(). */
int lh_tm_open(const char *path, const char *engine, uint64_t size);

/* Closes the TM pool cleanly, waiting for transactions in progress. 0 or -1. */
int lh_tm_close(void);

/* The root object (zeros in a new pool) and its size (unless `size` is NULL). */
void *lh_tm_root(size_t *size);

/* Allocates `size` zeroed bytes in the TM pool, as part of the calling transaction
 * (outside one, in a transaction of its own). NULL when full. */
LH_TM_PURE void *lh_tm_alloc(size_t size);

/* Frees a block of lh_tm_alloc when the calling transaction commits (at once outside
 * one). */
LH_TM_PURE void lh_tm_free(void *p);

/* The calling thread's last error of an lh_tm_ call. */
const char *lh_tm_errormsg(void);

#ifdef __cplusplus
}
#endif

#endif
