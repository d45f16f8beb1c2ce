/*
 * pmemcount.c -- LD_PRELOAD shim counting libpmem calls made by libpmemobj.
 *
 * Build: gcc -O2 -shared -fPIC -o pmemcount.so pmemcount.c -ldl
 *
 * libpmemobj (PMDK 1.12) reaches libpmem through the dynamic linker
 * (pmem_persist/flush/drain/memcpy/memset/memmove are undefined symbols in
 * libpmemobj.so), so interposing them here sees every call.  A per-thread
 * depth counter makes sure a libpmem function that internally re-enters an
 * exported one (e.g. persist -> flush + drain) is counted once, at the
 * outermost level.  "fences" = drain + persist + msync + mem* calls without
 * PMEM_F_MEM_NODRAIN/NOFLUSH (each of those ends in an sfence).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define PMEM_F_MEM_NODRAIN (1U << 0)
#define PMEM_F_MEM_NOFLUSH (1U << 5)

struct pmemcount {
	uint64_t drain, flush, persist, msync, deep_flush;
	uint64_t memcpy_, memset_, memmove_;
	uint64_t memop_drain;
	uint64_t flushed_lines;
	uint64_t fences;
};

static struct pmemcount C;	/* single-threaded use only */
static __thread int depth;

void pmemcount_get(struct pmemcount *out)
{
	*out = C;
}

#define REAL(name, type) \
	static __typeof__(type) *real_##name; \
	if (!real_##name) real_##name = dlsym(RTLD_NEXT, #name)

static uint64_t lines(const void *a, size_t len)
{
	if (!len)
		return 0;
	uintptr_t s = (uintptr_t)a & ~63ULL;
	uintptr_t e = ((uintptr_t)a + len + 63) & ~63ULL;
	return (e - s) / 64;
}

void pmem_drain(void)
{
	REAL(pmem_drain, void (void));
	if (depth++ == 0) {
		C.drain++;
		C.fences++;
	}
	real_pmem_drain();
	depth--;
}

void pmem_flush(const void *a, size_t len)
{
	REAL(pmem_flush, void (const void *, size_t));
	if (depth++ == 0) {
		C.flush++;
		C.flushed_lines += lines(a, len);
	}
	real_pmem_flush(a, len);
	depth--;
}

void pmem_persist(const void *a, size_t len)
{
	REAL(pmem_persist, void (const void *, size_t));
	if (depth++ == 0) {
		C.persist++;
		C.fences++;
		C.flushed_lines += lines(a, len);
	}
	real_pmem_persist(a, len);
	depth--;
}

int pmem_msync(const void *a, size_t len)
{
	REAL(pmem_msync, int (const void *, size_t));
	if (depth++ == 0) {
		C.msync++;
		C.fences++;
	}
	int r = real_pmem_msync(a, len);
	depth--;
	return r;
}

int pmem_deep_flush(const void *a, size_t len)
{
	REAL(pmem_deep_flush, int (const void *, size_t));
	if (depth++ == 0)
		C.deep_flush++;
	int r = real_pmem_deep_flush(a, len);
	depth--;
	return r;
}

static void memop(uint64_t *ctr, size_t len, const void *dst, unsigned flags)
{
	(*ctr)++;
	if (!(flags & PMEM_F_MEM_NOFLUSH))
		C.flushed_lines += lines(dst, len);
	if (!(flags & (PMEM_F_MEM_NODRAIN | PMEM_F_MEM_NOFLUSH))) {
		C.memop_drain++;
		C.fences++;
	}
}

void *pmem_memcpy(void *d, const void *s, size_t len, unsigned flags)
{
	REAL(pmem_memcpy, void *(void *, const void *, size_t, unsigned));
	if (depth++ == 0)
		memop(&C.memcpy_, len, d, flags);
	void *r = real_pmem_memcpy(d, s, len, flags);
	depth--;
	return r;
}

void *pmem_memmove(void *d, const void *s, size_t len, unsigned flags)
{
	REAL(pmem_memmove, void *(void *, const void *, size_t, unsigned));
	if (depth++ == 0)
		memop(&C.memmove_, len, d, flags);
	void *r = real_pmem_memmove(d, s, len, flags);
	depth--;
	return r;
}

void *pmem_memset(void *d, int c, size_t len, unsigned flags)
{
	REAL(pmem_memset, void *(void *, int, size_t, unsigned));
	if (depth++ == 0)
		memop(&C.memset_, len, d, flags);
	void *r = real_pmem_memset(d, c, len, flags);
	depth--;
	return r;
}
