/*
 * pmdk_bench.c -- baseline measurements of PMDK libpmemobj's allocator.
 *
 * Build:  gcc -O2 -Wall -o pmdk_bench pmdk_bench.c -lpmemobj -lpthread -ldl
 * Run:    PMEM_IS_PMEM_FORCE=1 ./pmdk_bench <mode> ...
 *
 * Modes:
 *   alloc <pool> <nthreads> <minsz> <maxsz> <ops_per_thread> <seed>
 *       Random alloc/free churn over per-thread arrays of 1000 persistent
 *       PMEMoid slots that live in the root object.  Creates a fresh 1 GiB pool.
 *   open  <pool> <nblocks> <repeats>
 *       Creates a pool, allocates nblocks blocks of [64,1024] B (oids kept in a
 *       persistent zalloc'ed array), closes, then times pmemobj_open, open +
 *       first allocations, and open after a simulated crash.
 *   fence <pool> <minsz> <maxsz> <ops>
 *       Single thread; counts libpmem calls per alloc / per free.  Needs
 *       LD_PRELOAD=./pmemcount.so (otherwise prints nothing useful).
 */
#define _GNU_SOURCE
#include <libpmemobj.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <errno.h>
#include <dlfcn.h>
#include <signal.h>
#include <sys/wait.h>
#include <sys/resource.h>

#define LAYOUT "pmdk_bench"
#define NSLOTS 1000
#define MAXTHREADS 2
#define POOL_SIZE (1ULL << 30)

struct root {
	PMEMoid slots[MAXTHREADS][NSLOTS];
	PMEMoid big;		/* array of oids for the open test */
	uint64_t nbig;
};

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + ts.tv_nsec;
}

static inline uint64_t xorshift64(uint64_t *s)
{
	uint64_t x = *s;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *s = x;
}

static void die(const char *what)
{
	fprintf(stderr, "%s: %s (errno %d: %s)\n", what, pmemobj_errormsg(),
		errno, strerror(errno));
	exit(1);
}

static PMEMobjpool *create_pool(const char *path, size_t size)
{
	unlink(path);
	PMEMobjpool *pop = pmemobj_create(path, LAYOUT, size, 0600);
	if (!pop)
		die("pmemobj_create");
	return pop;
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return x < y ? -1 : x > y;
}

static int cmp_dbl(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* ------------------------------------------------------------------ alloc */

struct targ {
	PMEMobjpool *pop;
	PMEMoid *slots;
	int tid;
	uint64_t seed;
	size_t minsz, maxsz;
	long ops;
	pthread_barrier_t *bar;
	double t0, t1, cpu;
	long nalloc, nfree, nfail;
	uint32_t *lat_a, *lat_f;	/* ns per op */
};

static void *worker(void *p)
{
	struct targ *a = p;
	uint64_t s = a->seed;
	size_t span = a->maxsz - a->minsz + 1;
	pthread_barrier_wait(a->bar);
	struct timespec c0, c1;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
	a->t0 = now();
	for (long k = 0; k < a->ops; k++) {
		uint64_t r = xorshift64(&s);
		unsigned i = (unsigned)(r % NSLOTS);
		if (OID_IS_NULL(a->slots[i])) {
			size_t sz = a->minsz + (xorshift64(&s) % span);
			uint64_t t = now_ns();
			int ret = pmemobj_alloc(a->pop, &a->slots[i], sz, 0,
						NULL, NULL);
			a->lat_a[a->nalloc] = (uint32_t)(now_ns() - t);
			if (ret)
				a->nfail++;
			else
				a->nalloc++;
		} else {
			uint64_t t = now_ns();
			pmemobj_free(&a->slots[i]);
			a->lat_f[a->nfree++] = (uint32_t)(now_ns() - t);
		}
	}
	a->t1 = now();
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
	a->cpu = (c1.tv_sec - c0.tv_sec) + (c1.tv_nsec - c0.tv_nsec) * 1e-9;
	return NULL;
}

static uint32_t pct(uint32_t *v, long n, double p)
{
	if (n == 0)
		return 0;
	long i = (long)(p * (n - 1));
	return v[i];
}

static int mode_alloc(int argc, char **argv)
{
	if (argc != 8) {
		fprintf(stderr, "alloc <pool> <nthreads> <minsz> <maxsz> <ops> <seed>\n");
		return 2;
	}
	const char *path = argv[2];
	int nt = atoi(argv[3]);
	size_t minsz = strtoull(argv[4], NULL, 0);
	size_t maxsz = strtoull(argv[5], NULL, 0);
	long ops = atol(argv[6]);
	uint64_t seed = strtoull(argv[7], NULL, 0);
	if (nt < 1 || nt > MAXTHREADS)
		return 2;

	PMEMobjpool *pop = create_pool(path, POOL_SIZE);
	PMEMoid root = pmemobj_root(pop, sizeof(struct root));
	struct root *rp = pmemobj_direct(root);

	/* preload: fill half the slots of every thread (single-threaded) */
	uint64_t ps = seed * 7919 + 1;
	size_t span = maxsz - minsz + 1;
	for (int t = 0; t < nt; t++)
		for (int i = 0; i < NSLOTS; i += 2) {
			size_t sz = minsz + xorshift64(&ps) % span;
			if (pmemobj_alloc(pop, &rp->slots[t][i], sz, 0, NULL,
					  NULL))
				die("preload alloc");
		}

	pthread_barrier_t bar;
	pthread_barrier_init(&bar, NULL, nt);
	struct targ a[MAXTHREADS];
	pthread_t th[MAXTHREADS];
	for (int t = 0; t < nt; t++) {
		memset(&a[t], 0, sizeof(a[t]));
		a[t].pop = pop;
		a[t].slots = rp->slots[t];
		a[t].tid = t;
		a[t].seed = seed * 1000003ULL + 12345 * (t + 1);
		a[t].minsz = minsz;
		a[t].maxsz = maxsz;
		a[t].ops = ops;
		a[t].bar = &bar;
		a[t].lat_a = malloc(sizeof(uint32_t) * ops);
		a[t].lat_f = malloc(sizeof(uint32_t) * ops);
		pthread_create(&th[t], NULL, worker, &a[t]);
	}
	for (int t = 0; t < nt; t++)
		pthread_join(th[t], NULL);

	double t0 = a[0].t0, t1 = a[0].t1;
	long tot = 0, nalloc = 0, nfree = 0, nfail = 0;
	double cpu = 0;
	for (int t = 0; t < nt; t++) {
		if (a[t].t0 < t0) t0 = a[t].t0;
		if (a[t].t1 > t1) t1 = a[t].t1;
		tot += a[t].ops;
		nalloc += a[t].nalloc;
		nfree += a[t].nfree;
		nfail += a[t].nfail;
		cpu += a[t].cpu;
	}
	/* merged latency percentiles */
	uint32_t *la = malloc(sizeof(uint32_t) * nalloc + 4);
	uint32_t *lf = malloc(sizeof(uint32_t) * nfree + 4);
	long ia = 0, jf = 0;
	for (int t = 0; t < nt; t++) {
		memcpy(la + ia, a[t].lat_a, sizeof(uint32_t) * a[t].nalloc);
		ia += a[t].nalloc;
		memcpy(lf + jf, a[t].lat_f, sizeof(uint32_t) * a[t].nfree);
		jf += a[t].nfree;
	}
	qsort(la, nalloc, sizeof(uint32_t), cmp_u32);
	qsort(lf, nfree, sizeof(uint32_t), cmp_u32);

	double el = t1 - t0;
	printf("RESULT mode=alloc threads=%d size=[%zu,%zu] ops_per_thread=%ld "
	       "elapsed_s=%.3f total_ops_s=%.0f per_thread_ops_s=%.0f "
	       "cpu_s=%.3f ops_per_cpu_s=%.0f "
	       "nalloc=%ld nfree=%ld nfail=%ld "
	       "alloc_ns_p50=%u p99=%u p999=%u max=%u "
	       "free_ns_p50=%u p99=%u p999=%u max=%u\n",
	       nt, minsz, maxsz, ops, el, tot / el, tot / el / nt,
	       cpu, tot / cpu,
	       nalloc, nfree, nfail,
	       pct(la, nalloc, .5), pct(la, nalloc, .99),
	       pct(la, nalloc, .999), pct(la, nalloc, 1.0),
	       pct(lf, nfree, .5), pct(lf, nfree, .99),
	       pct(lf, nfree, .999), pct(lf, nfree, 1.0));
	pmemobj_close(pop);
	unlink(path);
	return 0;
}

/* ------------------------------------------------------------------- open */

static const size_t first_sizes[] = {64, 256, 1024, 4096, 65536};
#define NFS (sizeof(first_sizes) / sizeof(first_sizes[0]))

static PMEMobjpool *open_pool(const char *path)
{
	PMEMobjpool *pop = pmemobj_open(path, LAYOUT);
	if (!pop)
		die("pmemobj_open");
	return pop;
}

static void summary(const char *label, double *v, int n)
{
	qsort(v, n, sizeof(double), cmp_dbl);
	printf("RESULT mode=open what=%s n=%d min_ms=%.3f median_ms=%.3f "
	       "max_ms=%.3f\n", label, n, v[0] * 1e3, v[n / 2] * 1e3,
	       v[n - 1] * 1e3);
}

/* allocate n blocks of [64,1024] into the persistent array (index base..) */
static void fill_blocks(PMEMobjpool *pop, PMEMoid *arr, uint64_t from,
			uint64_t to, uint64_t *seed)
{
	for (uint64_t i = from; i < to; i++) {
		size_t sz = 64 + xorshift64(seed) % (1024 - 64 + 1);
		if (pmemobj_alloc(pop, &arr[i], sz, 0, NULL, NULL))
			die("fill alloc");
	}
}

static int mode_open(int argc, char **argv)
{
	if (argc != 5) {
		fprintf(stderr, "open <pool> <nblocks> <repeats>\n");
		return 2;
	}
	const char *path = argv[2];
	uint64_t nb = strtoull(argv[3], NULL, 0);
	int rep = atoi(argv[4]);
	uint64_t seed = 0x9E3779B97F4A7C15ULL;

	double t = now();
	PMEMobjpool *pop = create_pool(path, POOL_SIZE);
	double tcreate = now() - t;
	PMEMoid root = pmemobj_root(pop, sizeof(struct root));
	struct root *rp = pmemobj_direct(root);
	/* room for the blocks plus the crash-test extras */
	if (pmemobj_zalloc(pop, &rp->big, sizeof(PMEMoid) * (nb + 100000), 0))
		die("zalloc big");
	rp->nbig = nb;
	pmemobj_persist(pop, &rp->nbig, sizeof(rp->nbig));
	PMEMoid *arr = pmemobj_direct(rp->big);
	t = now();
	fill_blocks(pop, arr, 0, nb, &seed);
	double tfill = now() - t;
	t = now();
	pmemobj_close(pop);
	double tclose = now() - t;
	printf("RESULT mode=open what=setup create_1GiB_ms=%.3f "
	       "fill_%llu_blocks_s=%.3f (%.0f allocs/s) close_ms=%.3f\n",
	       tcreate * 1e3, (unsigned long long)nb, tfill, nb / tfill,
	       tclose * 1e3);
	fflush(stdout);

	double *v = calloc(rep, sizeof(double));
	double *w = calloc(rep, sizeof(double));
	double (*fs)[NFS] = calloc(rep, sizeof(*fs));
	double (*ss)[NFS] = calloc(rep, sizeof(*ss));
	double (*iso)[NFS] = calloc(rep, sizeof(*iso));

	/* (a) plain open; close is not timed */
	for (int r = 0; r < rep; r++) {
		t = now();
		pop = open_pool(path);
		v[r] = now() - t;
		t = now();
		pmemobj_close(pop);
		w[r] = now() - t;
	}
	summary("open", v, rep);
	summary("close_after_open", w, rep);

	/* (b) open then first allocation of each size, in sequence */
	for (int r = 0; r < rep; r++) {
		pop = open_pool(path);
		PMEMoid o[NFS], o2[NFS];
		for (unsigned k = 0; k < NFS; k++) {
			t = now();
			if (pmemobj_alloc(pop, &o[k], first_sizes[k], 0, NULL,
					  NULL))
				die("first alloc");
			fs[r][k] = now() - t;
			t = now();
			if (pmemobj_alloc(pop, &o2[k], first_sizes[k], 0, NULL,
					  NULL))
				die("second alloc");
			ss[r][k] = now() - t;
		}
		for (unsigned k = 0; k < NFS; k++) {
			pmemobj_free(&o[k]);
			pmemobj_free(&o2[k]);
		}
		pmemobj_close(pop);
	}
	/* (c) open then a single first allocation of one size (isolated) */
	for (unsigned k = 0; k < NFS; k++)
		for (int r = 0; r < rep; r++) {
			pop = open_pool(path);
			PMEMoid o;
			t = now();
			if (pmemobj_alloc(pop, &o, first_sizes[k], 0, NULL,
					  NULL))
				die("iso alloc");
			iso[r][k] = now() - t;
			pmemobj_free(&o);
			pmemobj_close(pop);
		}
	for (unsigned k = 0; k < NFS; k++) {
		double a1[rep], a2[rep], a3[rep];
		for (int r = 0; r < rep; r++) {
			a1[r] = fs[r][k];
			a2[r] = ss[r][k];
			a3[r] = iso[r][k];
		}
		char lbl[96];
		snprintf(lbl, sizeof lbl, "first_alloc_in_sequence_%zu", first_sizes[k]);
		summary(lbl, a1, rep);
		snprintf(lbl, sizeof lbl, "second_alloc_in_sequence_%zu", first_sizes[k]);
		summary(lbl, a2, rep);
		snprintf(lbl, sizeof lbl, "first_alloc_only_%zu", first_sizes[k]);
		summary(lbl, a3, rep);
	}
	fflush(stdout);

	/*
	 * (d) crash: child opens the pool, allocates 10,000 more blocks (and
	 * frees them again so the heap state is stable across repeats), then
	 * allocates 1,000 and _exit()s without pmemobj_close.  Variant (e):
	 * child is SIGKILLed by the parent while busy allocating.
	 */
	for (int pass = 0; pass < 2; pass++) {
	/* pass 0: control, child closes cleanly; pass 1: no close */
	for (int r = 0; r < rep; r++) {
		pid_t pid = fork();
		if (pid == 0) {
			PMEMobjpool *c = open_pool(path);
			struct root *crp = pmemobj_direct(pmemobj_root(c,
						sizeof(struct root)));
			PMEMoid *carr = pmemobj_direct(crp->big);
			uint64_t cs = 77 + r;
			/* free previous round's extras, if any */
			for (uint64_t i = nb; i < nb + 1000; i++)
				if (!OID_IS_NULL(carr[i]))
					pmemobj_free(&carr[i]);
			fill_blocks(c, carr, nb, nb + 1000, &cs);
			if (pass == 0)
				pmemobj_close(c);
			_exit(0);
		}
		int st;
		waitpid(pid, &st, 0);
		if (!WIFEXITED(st) || WEXITSTATUS(st))
			die("crash child");
		t = now();
		pop = open_pool(path);
		v[r] = now() - t;
		PMEMoid o;
		t = now();
		if (pmemobj_alloc(pop, &o, 64, 0, NULL, NULL))
			die("post-crash alloc");
		w[r] = now() - t;
		pmemobj_free(&o);
		pmemobj_close(pop);
	}
	summary(pass ? "open_after_exit_without_close"
		     : "open_after_child_clean_close_control", v, rep);
	summary(pass ? "first_alloc64_after_exit_without_close"
		     : "first_alloc64_after_child_clean_close_control", w, rep);
	}
	double *v2 = calloc(rep, sizeof(double));
	double *w2 = calloc(rep, sizeof(double));

	for (int r = 0; r < rep; r++) {
		int pfd[2];
		if (pipe(pfd))
			die("pipe");
		pid_t pid = fork();
		if (pid == 0) {
			close(pfd[0]);
			PMEMobjpool *c = open_pool(path);
			struct root *crp = pmemobj_direct(pmemobj_root(c,
						sizeof(struct root)));
			PMEMoid *carr = pmemobj_direct(crp->big);
			uint64_t cs = 991 + r;
			if (write(pfd[1], "x", 1) != 1)
				_exit(1);
			/* churn forever on the extra slots until killed */
			for (;;) {
				uint64_t i = nb + 1000 + xorshift64(&cs) % 50000;
				if (OID_IS_NULL(carr[i]))
					fill_blocks(c, carr, i, i + 1, &cs);
				else
					pmemobj_free(&carr[i]);
			}
		}
		close(pfd[1]);
		char ch;
		if (read(pfd[0], &ch, 1) != 1)
			die("pipe read");
		close(pfd[0]);
		usleep(50000 + 7919 * r);	/* land somewhere mid-op */
		kill(pid, SIGKILL);
		int st;
		waitpid(pid, &st, 0);
		t = now();
		pop = open_pool(path);
		v[r] = now() - t;
		PMEMoid o;
		t = now();
		if (pmemobj_alloc(pop, &o, 64, 0, NULL, NULL))
			die("post-kill alloc");
		w[r] = now() - t;
		pmemobj_free(&o);
		pmemobj_close(pop);
		/* control: same heap contents, previous session closed cleanly */
		t = now();
		pop = open_pool(path);
		v2[r] = now() - t;
		t = now();
		if (pmemobj_alloc(pop, &o, 64, 0, NULL, NULL))
			die("post-kill control alloc");
		w2[r] = now() - t;
		pmemobj_free(&o);
		pmemobj_close(pop);
	}
	summary("open_after_sigkill_mid_churn", v, rep);
	summary("first_alloc64_after_sigkill", w, rep);
	summary("reopen_same_heap_clean_control", v2, rep);
	summary("first_alloc64_reopen_clean_control", w2, rep);

	/* sanity: all nb blocks still readable/valid */
	pop = open_pool(path);
	rp = pmemobj_direct(pmemobj_root(pop, sizeof(struct root)));
	arr = pmemobj_direct(rp->big);
	uint64_t live = 0;
	for (uint64_t i = 0; i < nb; i++)
		live += !OID_IS_NULL(arr[i]) && pmemobj_alloc_usable_size(arr[i]) >= 64;
	uint64_t objs = 0;
	PMEMoid it;
	t = now();
	POBJ_FOREACH(pop, it) objs++;
	double tw = now() - t;
	printf("RESULT mode=open what=sanity live_blocks=%llu heap_objects=%llu "
	       "foreach_walk_ms=%.3f\n", (unsigned long long)live,
	       (unsigned long long)objs, tw * 1e3);
	pmemobj_close(pop);
	if (!getenv("KEEP_POOL"))
		unlink(path);
	return 0;
}

static long minflt(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_minflt;
}

/* open1 <pool>: one open + first alloc of 64 B in this (fresh) process */
static int mode_open1(int argc, char **argv)
{
	if (argc != 3)
		return 2;
	long f0 = minflt();
	double t = now();
	PMEMobjpool *pop = open_pool(argv[2]);
	double to = now() - t;
	long f1 = minflt();
	PMEMoid o;
	t = now();
	if (pmemobj_alloc(pop, &o, 64, 0, NULL, NULL))
		die("alloc");
	double ta = now() - t;
	long f2 = minflt();
	pmemobj_free(&o);
	t = now();
	pmemobj_close(pop);
	double tc = now() - t;
	printf("RESULT mode=open1 open_ms=%.3f first_alloc64_ms=%.3f "
	       "close_ms=%.3f open_minflt=%ld alloc_minflt=%ld\n",
	       to * 1e3, ta * 1e3, tc * 1e3, f1 - f0, f2 - f1);
	return 0;
}

/* ------------------------------------------------------------------ fence */

struct pmemcount {
	uint64_t drain, flush, persist, msync, deep_flush;
	uint64_t memcpy_, memset_, memmove_;
	uint64_t memop_drain;		/* mem* calls that end with a drain */
	uint64_t flushed_lines;		/* 64 B lines covered by flush/persist */
	uint64_t fences;		/* drain + persist + draining mem* */
};

static int mode_fence(int argc, char **argv)
{
	if (argc != 6) {
		fprintf(stderr, "fence <pool> <minsz> <maxsz> <ops>\n");
		return 2;
	}
	void (*get)(struct pmemcount *) =
		(void (*)(struct pmemcount *))dlsym(RTLD_DEFAULT, "pmemcount_get");
	if (!get) {
		fprintf(stderr, "run with LD_PRELOAD=./pmemcount.so\n");
		return 2;
	}
	const char *path = argv[2];
	size_t minsz = strtoull(argv[3], NULL, 0);
	size_t maxsz = strtoull(argv[4], NULL, 0);
	long ops = atol(argv[5]);
	size_t span = maxsz - minsz + 1;
	PMEMobjpool *pop = create_pool(path, POOL_SIZE);
	struct root *rp = pmemobj_direct(pmemobj_root(pop, sizeof(struct root)));
	PMEMoid *slots = rp->slots[0];
	uint64_t s = 4242;
	for (int i = 0; i < NSLOTS; i += 2)
		if (pmemobj_alloc(pop, &slots[i], minsz + xorshift64(&s) % span,
				  0, NULL, NULL))
			die("preload");
	struct pmemcount A = {0}, F = {0}, b, e;
	long na = 0, nf = 0;
	for (long k = 0; k < ops; k++) {
		unsigned i = xorshift64(&s) % NSLOTS;
		int isalloc = OID_IS_NULL(slots[i]);
		size_t sz = minsz + xorshift64(&s) % span;
		get(&b);
		if (isalloc) {
			if (pmemobj_alloc(pop, &slots[i], sz, 0, NULL, NULL))
				die("alloc");
		} else {
			pmemobj_free(&slots[i]);
		}
		get(&e);
		struct pmemcount *d = isalloc ? &A : &F;
		d->drain += e.drain - b.drain;
		d->flush += e.flush - b.flush;
		d->persist += e.persist - b.persist;
		d->msync += e.msync - b.msync;
		d->deep_flush += e.deep_flush - b.deep_flush;
		d->memcpy_ += e.memcpy_ - b.memcpy_;
		d->memset_ += e.memset_ - b.memset_;
		d->memmove_ += e.memmove_ - b.memmove_;
		d->memop_drain += e.memop_drain - b.memop_drain;
		d->flushed_lines += e.flushed_lines - b.flushed_lines;
		d->fences += e.fences - b.fences;
		if (isalloc) na++; else nf++;
	}
	struct { const char *n; struct pmemcount *c; long k; } rows[] = {
		{"alloc", &A, na}, {"free", &F, nf}};
	for (int j = 0; j < 2; j++) {
		struct pmemcount *c = rows[j].c;
		double k = rows[j].k;
		printf("RESULT mode=fence op=%s size=[%zu,%zu] n=%ld per_op: "
		       "fences=%.3f drain=%.3f persist=%.3f flush=%.3f "
		       "memcpy=%.3f memset=%.3f memmove=%.3f mem_with_drain=%.3f "
		       "msync=%.3f deep_flush=%.3f flushed_64B_lines=%.2f\n",
		       rows[j].n, minsz, maxsz, rows[j].k,
		       c->fences / k, c->drain / k, c->persist / k,
		       c->flush / k, c->memcpy_ / k, c->memset_ / k,
		       c->memmove_ / k, c->memop_drain / k, c->msync / k,
		       c->deep_flush / k, c->flushed_lines / k);
	}
	pmemobj_close(pop);
	unlink(path);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s alloc|open|fence ...\n", argv[0]);
		return 2;
	}
	if (!strcmp(argv[1], "alloc"))
		return mode_alloc(argc, argv);
	if (!strcmp(argv[1], "open"))
		return mode_open(argc, argv);
	if (!strcmp(argv[1], "open1"))
		return mode_open1(argc, argv);
	if (!strcmp(argv[1], "fence"))
		return mode_fence(argc, argv);
	fprintf(stderr, "unknown mode\n");
	return 2;
}
