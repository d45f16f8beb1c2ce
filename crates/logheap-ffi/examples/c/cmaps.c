/* The same C maps on logheap's C API and on PMDK's libpmemobj: a chained hash map
 * (after PMDK's hashmap_tx), a red-black tree with a sentinel (after rbtree_map) and
 * a B-tree (after btree_map),
 * written once over four operations (GET, PUT, ALLOC, FREE) that each backend defines:
 *
 *   logheap: lh_tx_read / lh_tx_write / lh_tx_alloc / lh_tx_free, in lh_tx_begin ...
 *            lh_tx_commit; look-ups in read-only transactions;
 *   PMDK:    reads through pmemobj_direct, writes after pmemobj_tx_add_range,
 *            pmemobj_tx_zalloc / pmemobj_tx_free, in TX_BEGIN ... TX_END; look-ups
 *            outside transactions (PMDK's readers take no transaction).
 *
 * Build (scripts/c-maps-bench.sh does both):
 *   cc -O2 cmaps.c -o cmaps-logheap $(pkg-config --cflags --libs logheap)
 *   cc -O2 -DBACKEND_PMDK cmaps.c -o cmaps-pmdk -lpmemobj
 * Usage: cmaps-<backend> POOL ENGINE N   (ENGINE is ignored by PMDK)
 * Inserts N random keys, looks each up, removes half, on each map, one operation per
 * transaction, one thread; prints one line per map and phase: "map phase ops/s". */

#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef BACKEND_PMDK
#include <libpmemobj.h>
typedef PMEMoid ref_t;
static PMEMobjpool *pop;
#define NULLREF OID_NULL
#define OFF(r) ((r).off)
#define SAME(a, b) ((a).off == (b).off)
#define GET(r, off, p, n) memcpy((p), (char *)pmemobj_direct(r) + (off), (n))
#define PUT(r, off, p, n)                                               \
    do {                                                                \
        pmemobj_tx_add_range((r), (off), (n));                          \
        memcpy((char *)pmemobj_direct(r) + (off), (p), (n));            \
    } while (0)
#define ALLOC(n, out) (*(out) = pmemobj_tx_zalloc((n), 1))
#define FREE(r) pmemobj_tx_free(r)
#define TX(...)                                                        \
    do {                                                                \
        TX_BEGIN(pop) { __VA_ARGS__; }                                         \
        TX_ONABORT { fprintf(stderr, "a PMDK transaction aborted\n"); exit(1); } \
        TX_END                                                          \
    } while (0)
#define READ(...) do { __VA_ARGS__; } while (0)
static ref_t root_ref;
#else
#include <logheap.h>
#include <setjmp.h>
typedef lh_oid_t ref_t;
static lh_pool_t *pool;
static lh_tx_t *tx;
/* Where an operation that met a conflict goes back to (the background cleaner of the
 * log engine takes stripe locks too, so even one thread sees a conflict now and then):
 * the transaction is aborted and run again, as PMDK's TX_BEGIN returns by longjmp on
 * an abort. */
static jmp_buf retry;
#define NULLREF ((lh_oid_t){0})
#define OFF(r) ((r).off)
#define SAME(a, b) ((a).off == (b).off)
static void check(lh_status_t s) {
    if (s == LH_CONFLICT) longjmp(retry, 1);
    if (s != LH_OK) {
        fprintf(stderr, "%s: %s\n", lh_status_str(s), lh_errormsg());
        exit(1);
    }
}
#define GET(r, off, p, n) check(lh_tx_read(tx, (r), (off), (p), (n)))
#define PUT(r, off, p, n) check(lh_tx_write(tx, (r), (off), (p), (n)))
#define ALLOC(n, out) check(lh_tx_alloc(tx, (n), (out)))
#define FREE(r) check(lh_tx_free(tx, (r)))
/* Runs the statements as one transaction with `flags`, again after a conflict. */
#define RUN(flags, ...)                                    \
    do {                                                   \
        for (;;) {                                         \
            if (setjmp(retry) != 0) {                      \
                if (tx != NULL) lh_tx_abort(tx);           \
                tx = NULL;                                 \
                continue;                                  \
            }                                              \
            check(lh_tx_begin(pool, (flags), &tx));        \
            __VA_ARGS__;                                   \
            lh_status_t s_ = lh_tx_commit(tx);             \
            tx = NULL;                                     \
            if (s_ == LH_CONFLICT) continue;               \
            check(s_);                                     \
            break;                                         \
        }                                                  \
    } while (0)
#define TX(...) RUN(0, __VA_ARGS__)
#define READ(...) RUN(LH_TX_READONLY, __VA_ARGS__)
static ref_t root_ref;
#endif

/* The root: both maps' headers. */
struct root {
    ref_t buckets; /* BUCKETS refs */
    ref_t sentinel;
    ref_t btree;
};
#define BUCKETS 4096

/* ---- the hash map ---- */
struct entry {
    uint64_t key, value;
    ref_t next;
};

static ref_t bucket_array(void) {
    ref_t b;
    GET(root_ref, offsetof(struct root, buckets), &b, sizeof b);
    return b;
}

static uint64_t bucket_of(uint64_t key) { return (key * 0x9E3779B97F4A7C15ull) >> 52; }

static void hash_insert(uint64_t key, uint64_t value) {
    ref_t b = bucket_array(), head;
    GET(b, bucket_of(key) * sizeof(ref_t), &head, sizeof head);
    for (ref_t at = head; OFF(at) != 0;) {
        struct entry e;
        GET(at, 0, &e, sizeof e);
        if (e.key == key) {
            PUT(at, offsetof(struct entry, value), &value, 8);
            return;
        }
        at = e.next;
    }
    ref_t n;
    ALLOC(sizeof(struct entry), &n);
    struct entry e = {key, value, head};
    PUT(n, 0, &e, sizeof e);
    PUT(b, bucket_of(key) * sizeof(ref_t), &n, sizeof n);
}

static int hash_lookup(uint64_t key, uint64_t *value) {
    ref_t b = bucket_array(), at;
    GET(b, bucket_of(key) * sizeof(ref_t), &at, sizeof at);
    while (OFF(at) != 0) {
        struct entry e;
        GET(at, 0, &e, sizeof e);
        if (e.key == key) {
            *value = e.value;
            return 1;
        }
        at = e.next;
    }
    return 0;
}

static void hash_remove(uint64_t key) {
    ref_t b = bucket_array(), prev = NULLREF, at;
    GET(b, bucket_of(key) * sizeof(ref_t), &at, sizeof at);
    while (OFF(at) != 0) {
        struct entry e;
        GET(at, 0, &e, sizeof e);
        if (e.key == key) {
            if (OFF(prev) == 0) PUT(b, bucket_of(key) * sizeof(ref_t), &e.next, sizeof e.next);
            else PUT(prev, offsetof(struct entry, next), &e.next, sizeof e.next);
            FREE(at);
            return;
        }
        prev = at;
        at = e.next;
    }
}

/* ---- the red-black tree ---- */
struct node {
    uint64_t key, value, red;
    ref_t parent;
    ref_t slots[2];
};
#define F(f) offsetof(struct node, f)

static ref_t nil;
static struct node rd(ref_t r) {
    struct node n;
    GET(r, 0, &n, sizeof n);
    return n;
}
static void set_parent(ref_t r, ref_t p) { PUT(r, F(parent), &p, sizeof p); }
static void set_slot(ref_t r, int d, ref_t v) { PUT(r, F(slots) + d * sizeof(ref_t), &v, sizeof v); }
static void set_red(ref_t r, uint64_t red) { PUT(r, F(red), &red, 8); }
static ref_t rb_root(void) { return rd(nil).slots[0]; }

static void rotate(ref_t x, int d) {
    struct node nx = rd(x);
    ref_t y = nx.slots[!d];
    struct node ny = rd(y);
    set_slot(x, !d, ny.slots[d]);
    if (!SAME(ny.slots[d], nil)) set_parent(ny.slots[d], x);
    set_parent(y, nx.parent);
    set_slot(nx.parent, SAME(rd(nx.parent).slots[0], x) ? 0 : 1, y);
    set_slot(y, d, x);
    set_parent(x, y);
}

static void rb_insert(uint64_t key, uint64_t value) {
    ref_t y = nil, x = rb_root();
    int d = 0;
    while (!SAME(x, nil)) {
        struct node n = rd(x);
        if (n.key == key) {
            PUT(x, F(value), &value, 8);
            return;
        }
        y = x;
        d = key > n.key;
        x = n.slots[d];
    }
    ref_t z;
    ALLOC(sizeof(struct node), &z);
    struct node nz = {key, value, 1, y, {nil, nil}};
    PUT(z, 0, &nz, sizeof nz);
    set_slot(y, SAME(y, nil) ? 0 : d, z);
    for (;;) {
        struct node n = rd(z), p = rd(n.parent);
        if (!p.red) break;
        struct node g = rd(p.parent);
        int side = SAME(g.slots[0], n.parent) ? 0 : 1;
        ref_t uncle = g.slots[!side];
        if (rd(uncle).red) {
            set_red(n.parent, 0);
            set_red(uncle, 0);
            set_red(p.parent, 1);
            z = p.parent;
            continue;
        }
        if (SAME(p.slots[!side], z)) {
            z = n.parent;
            rotate(z, side);
            n = rd(z);
        }
        set_red(n.parent, 0);
        set_red(rd(n.parent).parent, 1);
        rotate(rd(n.parent).parent, !side);
    }
    set_red(rb_root(), 0);
}

static int rb_lookup(uint64_t key, uint64_t *value) {
    ref_t x = rb_root();
    while (!SAME(x, nil)) {
        struct node n = rd(x);
        if (n.key == key) {
            *value = n.value;
            return 1;
        }
        x = n.slots[key > n.key];
    }
    return 0;
}

static void transplant(ref_t u, ref_t v) {
    struct node nu = rd(u);
    set_slot(nu.parent, SAME(rd(nu.parent).slots[0], u) ? 0 : 1, v);
    set_parent(v, nu.parent);
}

static void rb_remove(uint64_t key) {
    ref_t z = rb_root();
    while (!SAME(z, nil)) {
        struct node n = rd(z);
        if (n.key == key) break;
        z = n.slots[key > n.key];
    }
    if (SAME(z, nil)) return;
    struct node nz = rd(z);
    uint64_t removed_red = nz.red;
    ref_t x;
    if (SAME(nz.slots[0], nil) || SAME(nz.slots[1], nil)) {
        x = SAME(nz.slots[0], nil) ? nz.slots[1] : nz.slots[0];
        transplant(z, x);
    } else {
        ref_t y = nz.slots[1];
        while (!SAME(rd(y).slots[0], nil)) y = rd(y).slots[0];
        struct node ny = rd(y);
        removed_red = ny.red;
        x = ny.slots[1];
        if (SAME(ny.parent, z)) {
            set_parent(x, y);
        } else {
            transplant(y, x);
            set_slot(y, 1, nz.slots[1]);
            set_parent(nz.slots[1], y);
        }
        transplant(z, y);
        set_slot(y, 0, nz.slots[0]);
        set_parent(nz.slots[0], y);
        set_red(y, nz.red);
    }
    if (!removed_red) {
        while (!SAME(x, rb_root()) && !rd(x).red) {
            struct node nx = rd(x), p = rd(nx.parent);
            int side = SAME(p.slots[0], x) ? 0 : 1;
            ref_t w = p.slots[!side];
            if (rd(w).red) {
                set_red(w, 0);
                set_red(nx.parent, 1);
                rotate(nx.parent, side);
                w = rd(nx.parent).slots[!side];
            }
            struct node nw = rd(w);
            if (!rd(nw.slots[side]).red && !rd(nw.slots[!side]).red) {
                set_red(w, 1);
                x = nx.parent;
                continue;
            }
            if (!rd(nw.slots[!side]).red) {
                set_red(nw.slots[side], 0);
                set_red(w, 1);
                rotate(w, !side);
                w = rd(nx.parent).slots[!side];
                nw = rd(w);
            }
            set_red(w, rd(nx.parent).red);
            set_red(nx.parent, 0);
            set_red(nw.slots[!side], 0);
            rotate(nx.parent, side);
            x = rb_root();
        }
        set_red(x, 0);
    }
    FREE(z);
}

/* ---- the B-tree (after btree_map: up to 7 items and 8 children a node; splits on
 * the way down, borrows and merges on removal) ---- */
#define ORDER 8
#define MIN_ITEMS (ORDER / 2 - 1)
struct item {
    uint64_t key, value;
};
struct bnode {
    uint64_t n;
    struct item items[ORDER - 1];
    ref_t slots[ORDER];
};

static ref_t bt_root(void) {
    ref_t r;
    GET(root_ref, offsetof(struct root, btree), &r, sizeof r);
    return r;
}
static void bt_set_root(ref_t r) { PUT(root_ref, offsetof(struct root, btree), &r, sizeof r); }
static struct bnode bget(ref_t r) {
    struct bnode n;
    GET(r, 0, &n, sizeof n);
    return n;
}
static void bput(ref_t r, const struct bnode *n) { PUT(r, 0, n, sizeof *n); }
static int leaf(const struct bnode *n) { return OFF(n->slots[0]) == 0; }

static void bt_split_child(ref_t p, struct bnode *parent, uint64_t i) {
    struct bnode full = bget(parent->slots[i]), right;
    memset(&right, 0, sizeof right);
    ref_t r;
    ALLOC(sizeof right, &r);
    const uint64_t mid = (ORDER - 1) / 2;
    right.n = full.n - mid - 1;
    memcpy(right.items, &full.items[mid + 1], right.n * sizeof(struct item));
    if (!leaf(&full)) memcpy(right.slots, &full.slots[mid + 1], (right.n + 1) * sizeof(ref_t));
    struct item median = full.items[mid];
    full.n = mid;
    memset(&full.items[mid], 0, (ORDER - 1 - mid) * sizeof(struct item));
    memset(&full.slots[mid + 1], 0, (ORDER - 1 - mid) * sizeof(ref_t));
    memmove(&parent->items[i + 1], &parent->items[i], (parent->n - i) * sizeof(struct item));
    memmove(&parent->slots[i + 2], &parent->slots[i + 1], (parent->n - i) * sizeof(ref_t));
    parent->items[i] = median;
    parent->slots[i + 1] = r;
    parent->n++;
    bput(parent->slots[i], &full);
    bput(r, &right);
    bput(p, parent);
}

static void bt_insert(uint64_t key, uint64_t value) {
    ref_t at = bt_root();
    if (OFF(at) == 0) {
        struct bnode n;
        memset(&n, 0, sizeof n);
        n.n = 1;
        n.items[0] = (struct item){key, value};
        ALLOC(sizeof n, &at);
        bput(at, &n);
        bt_set_root(at);
        return;
    }
    struct bnode n = bget(at);
    if (n.n == ORDER - 1) {
        struct bnode top;
        memset(&top, 0, sizeof top);
        top.slots[0] = at;
        ref_t t;
        ALLOC(sizeof top, &t);
        bt_split_child(t, &top, 0);
        bt_set_root(t);
        at = t;
        n = top;
    }
    for (;;) {
        uint64_t i = 0;
        while (i < n.n && n.items[i].key < key) i++;
        if (i < n.n && n.items[i].key == key) {
            n.items[i].value = value;
            bput(at, &n);
            return;
        }
        if (leaf(&n)) {
            memmove(&n.items[i + 1], &n.items[i], (n.n - i) * sizeof(struct item));
            n.items[i] = (struct item){key, value};
            n.n++;
            bput(at, &n);
            return;
        }
        struct bnode child = bget(n.slots[i]);
        if (child.n == ORDER - 1) {
            bt_split_child(at, &n, i);
            if (n.items[i].key == key) continue;
            if (n.items[i].key < key) i++;
            child = bget(n.slots[i]);
        }
        at = n.slots[i];
        n = child;
    }
}

static int bt_lookup(uint64_t key, uint64_t *value) {
    ref_t at = bt_root();
    while (OFF(at) != 0) {
        struct bnode n = bget(at);
        uint64_t i = 0;
        while (i < n.n && n.items[i].key < key) i++;
        if (i < n.n && n.items[i].key == key) {
            *value = n.items[i].value;
            return 1;
        }
        if (leaf(&n)) break;
        at = n.slots[i];
    }
    return 0;
}

static void bt_merge(ref_t p, struct bnode *n, uint64_t j) {
    struct bnode left = bget(n->slots[j]), right = bget(n->slots[j + 1]);
    ref_t gone = n->slots[j + 1];
    left.items[left.n] = n->items[j];
    memcpy(&left.items[left.n + 1], right.items, right.n * sizeof(struct item));
    memcpy(&left.slots[left.n + 1], right.slots, (right.n + 1) * sizeof(ref_t));
    left.n += right.n + 1;
    memmove(&n->items[j], &n->items[j + 1], (n->n - j - 1) * sizeof(struct item));
    memmove(&n->slots[j + 1], &n->slots[j + 2], (n->n - j - 1) * sizeof(ref_t));
    n->n--;
    n->items[n->n] = (struct item){0, 0};
    n->slots[n->n + 1] = NULLREF;
    bput(n->slots[j], &left);
    FREE(gone);
    bput(p, n);
}

/* Makes child i of p hold more than MIN_ITEMS; returns the child the key lies under. */
static uint64_t bt_fill(ref_t p, struct bnode *n, uint64_t i) {
    struct bnode c = bget(n->slots[i]), s;
    if (i > 0 && (s = bget(n->slots[i - 1])).n > MIN_ITEMS) {
        memmove(&c.items[1], &c.items[0], c.n * sizeof(struct item));
        memmove(&c.slots[1], &c.slots[0], (c.n + 1) * sizeof(ref_t));
        c.items[0] = n->items[i - 1];
        c.slots[0] = s.slots[s.n];
        n->items[i - 1] = s.items[s.n - 1];
        s.items[s.n - 1] = (struct item){0, 0};
        s.slots[s.n] = NULLREF;
        s.n--;
        c.n++;
        bput(n->slots[i - 1], &s);
        bput(n->slots[i], &c);
        bput(p, n);
        return i;
    }
    if (i < n->n && (s = bget(n->slots[i + 1])).n > MIN_ITEMS) {
        c.items[c.n] = n->items[i];
        c.slots[c.n + 1] = s.slots[0];
        c.n++;
        n->items[i] = s.items[0];
        memmove(&s.items[0], &s.items[1], (s.n - 1) * sizeof(struct item));
        memmove(&s.slots[0], &s.slots[1], s.n * sizeof(ref_t));
        s.n--;
        s.items[s.n] = (struct item){0, 0};
        s.slots[s.n + 1] = NULLREF;
        bput(n->slots[i + 1], &s);
        bput(n->slots[i], &c);
        bput(p, n);
        return i;
    }
    uint64_t j = i < n->n ? i : i - 1;
    bt_merge(p, n, j);
    return j;
}

static void bt_remove(uint64_t key) {
    ref_t at = bt_root();
    if (OFF(at) == 0) return;
    for (;;) {
        struct bnode n = bget(at);
        uint64_t i = 0;
        while (i < n.n && n.items[i].key < key) i++;
        int here = i < n.n && n.items[i].key == key;
        if (leaf(&n)) {
            if (here) {
                memmove(&n.items[i], &n.items[i + 1], (n.n - i - 1) * sizeof(struct item));
                n.n--;
                n.items[n.n] = (struct item){0, 0};
                if (n.n == 0 && SAME(at, bt_root())) {
                    FREE(at);
                    bt_set_root(NULLREF);
                } else {
                    bput(at, &n);
                }
            }
            return;
        }
        if (here) {
            struct bnode l = bget(n.slots[i]), r = bget(n.slots[i + 1]);
            if (l.n > MIN_ITEMS || r.n > MIN_ITEMS) {
                int from_left = l.n > MIN_ITEMS;
                ref_t c = n.slots[from_left ? i : i + 1];
                struct bnode d = bget(c);
                while (!leaf(&d)) d = bget(d.slots[from_left ? d.n : 0]);
                struct item repl = from_left ? d.items[d.n - 1] : d.items[0];
                n.items[i] = repl;
                bput(at, &n);
                key = repl.key;
                at = c;
                continue;
            }
            bt_merge(at, &n, i);
            ref_t next = n.slots[i];
            if (n.n == 0) {
                FREE(at);
                bt_set_root(next);
            }
            at = next;
            continue;
        }
        uint64_t under = i;
        if (bget(n.slots[i]).n <= MIN_ITEMS) under = bt_fill(at, &n, i);
        ref_t next = n.slots[under];
        if (n.n == 0) {
            FREE(at);
            bt_set_root(next);
        }
        at = next;
    }
}

/* ---- the driver ---- */
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void report(const char *map, const char *phase, uint64_t ops, double seconds) {
    printf("%s %s %.0f\n", map, phase, (double)ops / seconds);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: cmaps POOL ENGINE N\n");
        return 2;
    }
    uint64_t n = strtoull(argv[3], NULL, 10);
    uint64_t size = 64 * n * 8 + (64 << 20);
#ifdef BACKEND_PMDK
    pop = pmemobj_create(argv[1], "cmaps", size, 0600);
    if (pop == NULL) {
        fprintf(stderr, "pmemobj_create: %s\n", pmemobj_errormsg());
        return 1;
    }
    root_ref = pmemobj_root(pop, sizeof(struct root));
#else
    check(lh_pool_create(argv[1], argv[2], size, &pool));
    check(lh_pool_root(pool, &root_ref, NULL));
#endif
    TX({
        ref_t b;
        ALLOC(BUCKETS * sizeof(ref_t), &b);
        PUT(root_ref, offsetof(struct root, buckets), &b, sizeof b);
        ALLOC(sizeof(struct node), &nil);
        PUT(root_ref, offsetof(struct root, sentinel), &nil, sizeof nil);
        struct node s = {0, 0, 0, nil, {nil, nil}};
        PUT(nil, 0, &s, sizeof s);
    });
    uint64_t *keys = malloc(n * sizeof *keys);
    uint64_t seed = 88172645463325252ull;
    for (uint64_t i = 0; i < n; i++) {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        keys[i] = seed;
    }
    struct {
        const char *name;
        void (*insert)(uint64_t, uint64_t);
        int (*lookup)(uint64_t, uint64_t *);
        void (*remove)(uint64_t);
    } maps[] = {{"hashmap", hash_insert, hash_lookup, hash_remove},
                {"rbtree", rb_insert, rb_lookup, rb_remove},
                {"btree", bt_insert, bt_lookup, bt_remove}};
    for (volatile size_t m = 0; m < sizeof maps / sizeof maps[0]; m++) {
        double t0 = now();
        for (volatile uint64_t i = 0; i < n; i++) TX(maps[m].insert(keys[i], i));
        double t1 = now();
        volatile uint64_t found = 0;
        uint64_t v = 0;
        for (volatile uint64_t i = 0; i < n; i++) READ(found += maps[m].lookup(keys[i], &v) && v == i);
        double t2 = now();
        for (volatile uint64_t i = 0; i < n; i += 2) TX(maps[m].remove(keys[i]));
        double t3 = now();
        /* Not timed: the removed keys are gone, the others there. */
        volatile uint64_t right = 0;
        for (volatile uint64_t i = 0; i < n; i++)
            READ(right += maps[m].lookup(keys[i], &v) == (i % 2 == 1));
        if (right != n) {
            fprintf(stderr, "%s: %llu of %llu keys right after the removals\n", maps[m].name,
                    (unsigned long long)right, (unsigned long long)n);
            return 1;
        }
        if (found != n) {
            fprintf(stderr, "%s: %llu of %llu keys found\n", maps[m].name, (unsigned long long)found,
                    (unsigned long long)n);
            return 1;
        }
        report(maps[m].name, "insert", n, t1 - t0);
        report(maps[m].name, "lookup", n, t2 - t1);
        report(maps[m].name, "remove", (n + 1) / 2, t3 - t2);
    }
#ifdef BACKEND_PMDK
    pmemobj_close(pop);
#else
    check(lh_pool_close(pool));
#endif
    free(keys);
    return 0;
}
