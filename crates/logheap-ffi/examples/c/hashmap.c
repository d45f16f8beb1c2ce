/* A persistent hash map on logheap's C API, after PMDK's hashmap_tx example: a root
 * holding a bucket array, each bucket a list of entries {key, value, next}.
 *
 * Usage: hashmap POOL ENGINE
 * Creates POOL on ENGINE, inserts keys from two threads at once (with the callback
 * form of transactions), removes some (with begin/commit by hand, retrying
 * conflicts), closes, reopens and checks every key; then checks the API's errors.
 * Prints "ok" and exits 0, or names the first failure and exits 1. */

#include <logheap.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BUCKETS 64
#define KEYS_PER_THREAD 400

struct root {
    lh_oid_t buckets; /* uint64_t[BUCKETS] of entry oids */
    uint64_t count;
};

struct entry {
    uint64_t key;
    uint64_t value;
    lh_oid_t next;
};

static lh_pool_t *pool;
static lh_oid_t root;

static void fail(const char *what, lh_status_t s) {
    fprintf(stderr, "FAIL: %s: %s: %s\n", what, lh_status_str(s), lh_errormsg());
    exit(1);
}

static void check(const char *what, lh_status_t got, lh_status_t want) {
    if (got != want) {
        fprintf(stderr, "FAIL: %s: got %s, want %s (%s)\n", what, lh_status_str(got),
                lh_status_str(want), lh_errormsg());
        exit(1);
    }
}

/* Returns the status of the first failing call (LH_CONFLICT included). */
#define TRY(call)                          \
    do {                                   \
        lh_status_t s_ = (call);           \
        if (s_ != LH_OK) return (int)s_;   \
    } while (0)

static int create_buckets(lh_tx_t *tx, void *arg) {
    (void)arg;
    TRY(lh_tx_alloc_into(tx, BUCKETS * sizeof(uint64_t), root,
                         offsetof(struct root, buckets), NULL));
    return LH_OK;
}

struct insert_arg {
    uint64_t key, value;
};

static int insert(lh_tx_t *tx, void *argp) {
    struct insert_arg *arg = argp;
    struct root r;
    TRY(lh_tx_read(tx, root, 0, &r, sizeof r));
    uint64_t b = arg->key % BUCKETS;
    lh_oid_t head;
    TRY(lh_tx_read(tx, r.buckets, b * 8, &head, sizeof head));
    for (lh_oid_t at = head; at.off != 0;) {
        struct entry e;
        TRY(lh_tx_read(tx, at, 0, &e, sizeof e));
        if (e.key == arg->key) {
            TRY(lh_tx_write(tx, at, offsetof(struct entry, value), &arg->value, 8));
            return LH_OK;
        }
        at = e.next;
    }
    lh_oid_t fresh;
    TRY(lh_tx_alloc_into(tx, sizeof(struct entry), r.buckets, b * 8, &fresh));
    struct entry e = {arg->key, arg->value, head};
    TRY(lh_tx_write(tx, fresh, 0, &e, sizeof e));
    r.count++;
    TRY(lh_tx_write(tx, root, offsetof(struct root, count), &r.count, 8));
    return LH_OK;
}

/* Looks `key` up in a read-only transaction: its value, or 0. */
struct lookup_arg {
    uint64_t key, value;
};

static int lookup(lh_tx_t *tx, void *argp) {
    struct lookup_arg *arg = argp;
    struct root r;
    TRY(lh_tx_read(tx, root, 0, &r, sizeof r));
    lh_oid_t at;
    TRY(lh_tx_read(tx, r.buckets, (arg->key % BUCKETS) * 8, &at, sizeof at));
    arg->value = 0;
    while (at.off != 0) {
        struct entry e;
        TRY(lh_tx_read(tx, at, 0, &e, sizeof e));
        if (e.key == arg->key) {
            arg->value = e.value;
            break;
        }
        at = e.next;
    }
    return LH_OK;
}

/* Removes `key` with a transaction begun and committed by hand, retried on conflict. */
static lh_status_t remove_key(uint64_t key) {
    for (;;) {
        lh_tx_t *tx;
        lh_status_t s = lh_tx_begin(pool, 0, &tx);
        if (s != LH_OK) return s;
        struct root r;
        lh_oid_t prev = {0}, at;
        uint64_t b = key % BUCKETS;
        s = lh_tx_read(tx, root, 0, &r, sizeof r);
        if (s == LH_OK) s = lh_tx_read(tx, r.buckets, b * 8, &at, sizeof at);
        while (s == LH_OK && at.off != 0) {
            struct entry e;
            s = lh_tx_read(tx, at, 0, &e, sizeof e);
            if (s != LH_OK) break;
            if (e.key == key) {
                if (prev.off == 0)
                    s = lh_tx_write(tx, r.buckets, b * 8, &e.next, 8);
                else
                    s = lh_tx_write(tx, prev, offsetof(struct entry, next), &e.next, 8);
                if (s == LH_OK) s = lh_tx_free(tx, at);
                r.count--;
                if (s == LH_OK)
                    s = lh_tx_write(tx, root, offsetof(struct root, count), &r.count, 8);
                break;
            }
            prev = at;
            at = e.next;
        }
        if (s != LH_OK) {
            lh_tx_abort(tx);
            if (s == LH_CONFLICT) continue;
            return s;
        }
        s = lh_tx_commit(tx);
        if (s != LH_CONFLICT) return s;
    }
}

static void *inserter(void *arg) {
    uint64_t first = (uint64_t)(uintptr_t)arg;
    for (uint64_t k = first; k < first + KEYS_PER_THREAD; k++) {
        struct insert_arg a = {k, k * 7 + 1};
        lh_status_t s = lh_pool_transaction(pool, 0, insert, &a);
        if (s != LH_OK) fail("insert", s);
    }
    return NULL;
}

static uint64_t value_of(uint64_t key) {
    struct lookup_arg a = {key, 0};
    lh_status_t s = lh_pool_transaction(pool, LH_TX_READONLY, lookup, &a);
    if (s != LH_OK) fail("lookup", s);
    return a.value;
}

static int write_in_read_only(lh_tx_t *tx, void *arg) {
    (void)arg;
    uint64_t one = 1;
    return (int)lh_tx_write(tx, root, offsetof(struct root, count), &one, 8);
}

static int give_up(lh_tx_t *tx, void *arg) {
    lh_oid_t fresh;
    TRY(lh_tx_alloc(tx, 64, &fresh));
    *(lh_oid_t *)arg = fresh;
    return 42; /* aborts: the allocation never happened */
}

static void check_errors(const char *path, const char *engine) {
    lh_pool_t *other;
    check("open of a missing file", lh_pool_open("/nonexistent/dir/pool", &other), LH_ENOENT);
    check("create over an existing pool", lh_pool_create(path, engine, 0, &other), LH_EEXIST);
    check("a second open of an open pool", lh_pool_open(path, &other), LH_EBUSY);
    check("a null path", lh_pool_open(NULL, &other), LH_EINVAL);
    check("a null out pointer", lh_pool_open(path, NULL), LH_EINVAL);
    check("an unknown engine", lh_pool_create("/tmp/never", "no-such-engine", 0, &other), LH_EINVAL);
    check("close of a null pool", lh_pool_close(NULL), LH_EINVAL);
    check("close of a stray pointer", lh_pool_close((lh_pool_t *)&root), LH_EINVAL);
    check("begin on a stray pointer", lh_tx_begin((lh_pool_t *)&root, 0, (lh_tx_t **)&other), LH_EINVAL);
    check("commit of a null transaction", lh_tx_commit(NULL), LH_EINVAL);
    check("commit of a stray pointer", lh_tx_commit((lh_tx_t *)&root), LH_EINVAL);
    check("a null callback", lh_pool_transaction(pool, 0, NULL, NULL), LH_EINVAL);
    check("unknown flags", lh_pool_transaction(pool, 8, insert, NULL), LH_EINVAL);
    check("a write in a read-only transaction",
          lh_pool_transaction(pool, LH_TX_READONLY, write_in_read_only, NULL), LH_EABORTED);

    lh_oid_t dropped = {0};
    check("a callback's own abort", lh_pool_transaction(pool, 0, give_up, &dropped), LH_EABORTED);
    if (dropped.off == 0) fail("the aborted callback allocated nothing", LH_OK);

    lh_tx_t *tx;
    check("begin", lh_tx_begin(pool, 0, &tx), LH_OK);
    check("close under a transaction", lh_pool_close(pool), LH_EBUSY);
    uint64_t x;
    check("a read of null", lh_tx_read(tx, (lh_oid_t){0}, 0, &x, 8), LH_EINVAL);
    check("a read past the home space", lh_tx_read(tx, (lh_oid_t){1ull << 62}, 0, &x, 8), LH_EINVAL);
    check("a free of no allocation", lh_tx_free(tx, (lh_oid_t){root.off + 8}), LH_EINVAL);
    check("abort", lh_tx_abort(tx), LH_OK);
    check("commit after abort", lh_tx_commit(tx), LH_EINVAL);

    check("read-only begin", lh_tx_begin(pool, LH_TX_READONLY, &tx), LH_OK);
    check("alloc in a read-only transaction", lh_tx_alloc(tx, 8, &dropped), LH_EREADONLY);
    check("read-only commit", lh_tx_commit(tx), LH_OK);

    const void *direct;
    lh_status_t s = lh_pool_direct(pool, root, sizeof(struct root), &direct);
    if (strcmp(engine, "redo") == 0 || strcmp(engine, "undo") == 0) {
        check("a direct pointer", s, LH_OK);
        struct root r;
        memcpy(&r, direct, sizeof r);
        if (r.count != 2 * KEYS_PER_THREAD - KEYS_PER_THREAD / 2)
            fail("the direct pointer shows the committed count", LH_OK);
    } else {
        check("a direct pointer on an engine without one", s, LH_ENOTSUP);
    }
    lh_stats_t stats;
    check("stats", lh_pool_stats(pool, &stats), LH_OK);
    if (stats.transactions == 0 || stats.allocations < 2 * KEYS_PER_THREAD - KEYS_PER_THREAD / 2)
        fail("stats count transactions and allocations", LH_OK);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: hashmap POOL ENGINE\n");
        return 2;
    }
    const char *path = argv[1], *engine = argv[2];
    lh_status_t s = lh_pool_create(path, engine, 16 << 20, &pool);
    if (s != LH_OK) fail("create", s);
    uint64_t root_size;
    check("root", lh_pool_root(pool, &root, &root_size), LH_OK);
    if (root_size < sizeof(struct root)) fail("the root is large enough", LH_OK);
    check("buckets", lh_pool_transaction(pool, 0, create_buckets, NULL), LH_OK);

    pthread_t threads[2];
    for (int t = 0; t < 2; t++)
        pthread_create(&threads[t], NULL, inserter, (void *)(uintptr_t)(1 + t * KEYS_PER_THREAD));
    for (int t = 0; t < 2; t++) pthread_join(threads[t], NULL);
    /* Every other key of the first thread's goes. */
    for (uint64_t k = 1; k < 1 + KEYS_PER_THREAD; k += 2) {
        s = remove_key(k);
        if (s != LH_OK) fail("remove", s);
    }
    check("close", lh_pool_close(pool), LH_OK);
    check("close again", lh_pool_close(pool), LH_EINVAL);

    check("reopen", lh_pool_open(path, &pool), LH_OK);
    check("root after reopen", lh_pool_root(pool, &root, NULL), LH_OK);
    for (uint64_t k = 1; k < 1 + 2 * KEYS_PER_THREAD; k++) {
        uint64_t want = (k < 1 + KEYS_PER_THREAD && k % 2 == 1) ? 0 : k * 7 + 1;
        if (value_of(k) != want) {
            fprintf(stderr, "FAIL: key %llu reads %llu, want %llu\n", (unsigned long long)k,
                    (unsigned long long)value_of(k), (unsigned long long)want);
            return 1;
        }
    }
    check_errors(path, engine);
    check("final close", lh_pool_close(pool), LH_OK);

    /* A file that is no pool. */
    char foreign[4096];
    snprintf(foreign, sizeof foreign, "%s.foreign", path);
    FILE *f = fopen(foreign, "w");
    for (int i = 0; i < 1 << 16; i++) fputc('x', f);
    fclose(f);
    check("open of a foreign file", lh_pool_open(foreign, &pool), LH_ECORRUPT);
    unlink(foreign);
    puts("ok");
    return 0;
}
