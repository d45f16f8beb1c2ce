/* A persistent red-black tree map (u64 keys and values) on logheap's C API, after
 * PMDK's rbtree_map example: a sentinel node for nil and the root's parent, inserts
 * and removes with Cormen et al.'s fix-ups, in transactions begun and committed by
 * hand (lh_tx_begin ... lh_tx_commit, retried on LH_CONFLICT).
 *
 * Usage: rbtree POOL ENGINE
 * Inserts 2,000 random keys, replaces some, removes half, checking each answer and
 * the red-black invariants against a model; closes, reopens and checks again.
 * Prints "ok" and exits 0, or names the first failure and exits 1. */

#include <logheap.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEYS 2000

enum { BLACK = 0, RED = 1 };
enum { LEFT = 0, RIGHT = 1 };

struct node {
    uint64_t key, value;
    uint64_t color;
    lh_oid_t parent;
    lh_oid_t slots[2];
};

struct map {
    lh_oid_t sentinel; /* black; its slots[LEFT] is the root */
    uint64_t count;
};

/* One operation: its transaction and the map's header. */
struct ctx {
    lh_tx_t *tx;
    lh_oid_t header;
    lh_oid_t nil;
};

#define TRY(call)                          \
    do {                                   \
        lh_status_t s_ = (call);           \
        if (s_ != LH_OK) return s_;        \
    } while (0)

static lh_status_t get(struct ctx *c, lh_oid_t at, struct node *n) { return lh_tx_read(c->tx, at, 0, n, sizeof *n); }
static lh_status_t put(struct ctx *c, lh_oid_t at, const struct node *n) { return lh_tx_write(c->tx, at, 0, n, sizeof *n); }

#define FIELD(f) offsetof(struct node, f)
static lh_status_t set_parent(struct ctx *c, lh_oid_t at, lh_oid_t p) { return lh_tx_write(c->tx, at, FIELD(parent), &p, 8); }
static lh_status_t set_slot(struct ctx *c, lh_oid_t at, int d, lh_oid_t v) { return lh_tx_write(c->tx, at, FIELD(slots) + 8 * d, &v, 8); }
static lh_status_t set_color(struct ctx *c, lh_oid_t at, uint64_t color) { return lh_tx_write(c->tx, at, FIELD(color), &color, 8); }
static lh_status_t color_of(struct ctx *c, lh_oid_t at, uint64_t *color) { return lh_tx_read(c->tx, at, FIELD(color), color, 8); }

static int same(lh_oid_t a, lh_oid_t b) { return a.off == b.off; }

static lh_status_t root_of(struct ctx *c, lh_oid_t *root) {
    return lh_tx_read(c->tx, c->nil, FIELD(slots) + 8 * LEFT, root, 8);
}

/* Rotates around `x` towards direction `d` (LEFT: x's right child comes up). */
static lh_status_t rotate(struct ctx *c, lh_oid_t x, int d) {
    struct node nx, ny;
    TRY(get(c, x, &nx));
    lh_oid_t y = nx.slots[!d];
    TRY(get(c, y, &ny));
    TRY(set_slot(c, x, !d, ny.slots[d]));
    if (!same(ny.slots[d], c->nil)) TRY(set_parent(c, ny.slots[d], x));
    TRY(set_parent(c, y, nx.parent));
    struct node np;
    TRY(get(c, nx.parent, &np));
    TRY(set_slot(c, nx.parent, same(np.slots[LEFT], x) ? LEFT : RIGHT, y));
    TRY(set_slot(c, y, d, x));
    return set_parent(c, x, y);
}

static lh_status_t insert_fixup(struct ctx *c, lh_oid_t z) {
    for (;;) {
        struct node nz, np, ng;
        TRY(get(c, z, &nz));
        TRY(get(c, nz.parent, &np));
        if (np.color != RED) break;
        TRY(get(c, np.parent, &ng));
        int d = same(ng.slots[LEFT], nz.parent) ? LEFT : RIGHT; /* the parent's side */
        lh_oid_t uncle = ng.slots[!d];
        uint64_t uc;
        TRY(color_of(c, uncle, &uc));
        if (uc == RED) {
            TRY(set_color(c, nz.parent, BLACK));
            TRY(set_color(c, uncle, BLACK));
            TRY(set_color(c, np.parent, RED));
            z = np.parent;
            continue;
        }
        if (same(np.slots[!d], z)) {
            z = nz.parent;
            TRY(rotate(c, z, d));
            TRY(get(c, z, &nz));
        }
        TRY(set_color(c, nz.parent, BLACK));
        TRY(get(c, nz.parent, &np));
        TRY(set_color(c, np.parent, RED));
        TRY(rotate(c, np.parent, !d));
    }
    lh_oid_t root;
    TRY(root_of(c, &root));
    return set_color(c, root, BLACK);
}

/* Inserts or replaces; *found says which. */
static lh_status_t insert(struct ctx *c, uint64_t key, uint64_t value, int *found) {
    lh_oid_t y = c->nil, x;
    TRY(root_of(c, &x));
    int d = LEFT;
    while (!same(x, c->nil)) {
        struct node n;
        TRY(get(c, x, &n));
        if (n.key == key) {
            *found = 1;
            return lh_tx_write(c->tx, x, FIELD(value), &value, 8);
        }
        y = x;
        d = key > n.key ? RIGHT : LEFT;
        x = n.slots[d];
    }
    *found = 0;
    lh_oid_t z;
    TRY(lh_tx_alloc(c->tx, sizeof(struct node), &z));
    struct node nz = {key, value, RED, y, {c->nil, c->nil}};
    TRY(put(c, z, &nz));
    TRY(set_slot(c, y, same(y, c->nil) ? LEFT : d, z));
    TRY(insert_fixup(c, z));
    struct map m;
    TRY(lh_tx_read(c->tx, c->header, 0, &m, sizeof m));
    m.count++;
    return lh_tx_write(c->tx, c->header, 0, &m, sizeof m);
}

static lh_status_t find(struct ctx *c, uint64_t key, lh_oid_t *at, uint64_t *value) {
    lh_oid_t x;
    TRY(root_of(c, &x));
    while (!same(x, c->nil)) {
        struct node n;
        TRY(get(c, x, &n));
        if (n.key == key) {
            if (value) *value = n.value;
            break;
        }
        x = n.slots[key > n.key ? RIGHT : LEFT];
    }
    *at = x;
    return LH_OK;
}

/* Puts `v` where `u` was under u's parent. */
static lh_status_t transplant(struct ctx *c, lh_oid_t u, lh_oid_t v) {
    struct node nu, np;
    TRY(get(c, u, &nu));
    TRY(get(c, nu.parent, &np));
    TRY(set_slot(c, nu.parent, same(np.slots[LEFT], u) ? LEFT : RIGHT, v));
    return set_parent(c, v, nu.parent);
}

static lh_status_t remove_fixup(struct ctx *c, lh_oid_t x) {
    lh_oid_t root;
    TRY(root_of(c, &root));
    for (;;) {
        struct node nx, np, nw;
        TRY(get(c, x, &nx));
        if (same(x, root) || nx.color == RED) break;
        TRY(get(c, nx.parent, &np));
        int d = same(np.slots[LEFT], x) ? LEFT : RIGHT;
        lh_oid_t w = np.slots[!d];
        TRY(get(c, w, &nw));
        if (nw.color == RED) {
            TRY(set_color(c, w, BLACK));
            TRY(set_color(c, nx.parent, RED));
            TRY(rotate(c, nx.parent, d));
            TRY(get(c, nx.parent, &np));
            w = np.slots[!d];
            TRY(get(c, w, &nw));
        }
        uint64_t near, far;
        TRY(color_of(c, nw.slots[d], &near));
        TRY(color_of(c, nw.slots[!d], &far));
        if (near == BLACK && far == BLACK) {
            TRY(set_color(c, w, RED));
            x = nx.parent;
            continue;
        }
        if (far == BLACK) {
            TRY(set_color(c, nw.slots[d], BLACK));
            TRY(set_color(c, w, RED));
            TRY(rotate(c, w, !d));
            TRY(get(c, nx.parent, &np));
            w = np.slots[!d];
            TRY(get(c, w, &nw));
        }
        TRY(set_color(c, w, np.color));
        TRY(set_color(c, nx.parent, BLACK));
        TRY(set_color(c, nw.slots[!d], BLACK));
        TRY(rotate(c, nx.parent, d));
        x = root;
        TRY(root_of(c, &root));
        x = root;
    }
    return set_color(c, x, BLACK);
}

static lh_status_t remove_key(struct ctx *c, uint64_t key, int *found) {
    lh_oid_t z;
    TRY(find(c, key, &z, NULL));
    *found = !same(z, c->nil);
    if (!*found) return LH_OK;
    struct node nz;
    TRY(get(c, z, &nz));
    uint64_t removed_color = nz.color;
    lh_oid_t x;
    if (same(nz.slots[LEFT], c->nil) || same(nz.slots[RIGHT], c->nil)) {
        x = same(nz.slots[LEFT], c->nil) ? nz.slots[RIGHT] : nz.slots[LEFT];
        TRY(transplant(c, z, x));
    } else {
        lh_oid_t y = nz.slots[RIGHT];
        struct node ny;
        TRY(get(c, y, &ny));
        while (!same(ny.slots[LEFT], c->nil)) {
            y = ny.slots[LEFT];
            TRY(get(c, y, &ny));
        }
        removed_color = ny.color;
        x = ny.slots[RIGHT];
        if (same(ny.parent, z)) {
            TRY(set_parent(c, x, y));
        } else {
            TRY(transplant(c, y, x));
            TRY(set_slot(c, y, RIGHT, nz.slots[RIGHT]));
            TRY(set_parent(c, nz.slots[RIGHT], y));
        }
        TRY(transplant(c, z, y));
        TRY(set_slot(c, y, LEFT, nz.slots[LEFT]));
        TRY(set_parent(c, nz.slots[LEFT], y));
        TRY(set_color(c, y, nz.color));
    }
    if (removed_color == BLACK) TRY(remove_fixup(c, x));
    TRY(lh_tx_free(c->tx, z));
    struct map m;
    TRY(lh_tx_read(c->tx, c->header, 0, &m, sizeof m));
    m.count--;
    return lh_tx_write(c->tx, c->header, 0, &m, sizeof m);
}

/* Checks order, colours (no red node with a red child, the root black) and equal
 * black heights; counts the nodes. */
static lh_status_t walk(struct ctx *c, lh_oid_t x, uint64_t lo, uint64_t hi, int *black, uint64_t *count) {
    if (same(x, c->nil)) {
        *black = 1;
        return LH_OK;
    }
    struct node n;
    TRY(get(c, x, &n));
    if (n.key < lo || n.key > hi) return LH_EABORTED;
    if (n.color == RED) {
        uint64_t l, r;
        TRY(color_of(c, n.slots[LEFT], &l));
        TRY(color_of(c, n.slots[RIGHT], &r));
        if (l == RED || r == RED) return LH_EABORTED;
    }
    int bl, br;
    TRY(walk(c, n.slots[LEFT], lo, n.key == 0 ? 0 : n.key - 1, &bl, count));
    TRY(walk(c, n.slots[RIGHT], n.key + 1, hi, &br, count));
    if (bl != br) return LH_EABORTED;
    *black = bl + (n.color == BLACK);
    (*count)++;
    return LH_OK;
}

static lh_oid_t header;

/* Runs `op` in a transaction begun and committed by hand, retrying conflicts. */
enum kind { INSERT, REMOVE, LOOKUP, CHECK };

static lh_status_t run(lh_pool_t *pool, enum kind kind, uint64_t key, uint64_t *value, int *found) {
    for (;;) {
        struct ctx c = {NULL, header, {0}};
        lh_status_t s = lh_tx_begin(pool, kind == LOOKUP || kind == CHECK ? LH_TX_READONLY : 0, &c.tx);
        if (s != LH_OK) return s;
        struct map m;
        s = lh_tx_read(c.tx, header, 0, &m, sizeof m);
        if (s == LH_OK && m.sentinel.off == 0) { /* first use: make the sentinel */
            struct node nil;
            memset(&nil, 0, sizeof nil);
            s = lh_tx_alloc_into(c.tx, sizeof nil, header, offsetof(struct map, sentinel), &m.sentinel);
            if (s == LH_OK) {
                nil.parent = nil.slots[LEFT] = nil.slots[RIGHT] = m.sentinel;
                s = lh_tx_write(c.tx, m.sentinel, 0, &nil, sizeof nil);
            }
        }
        c.nil = m.sentinel;
        if (s == LH_OK) {
            lh_oid_t at;
            uint64_t black = 0, count = 0;
            int bh;
            switch (kind) {
            case INSERT: s = insert(&c, key, *value, found); break;
            case REMOVE: s = remove_key(&c, key, found); break;
            case LOOKUP:
                s = find(&c, key, &at, value);
                *found = !same(at, c.nil);
                break;
            case CHECK:
                s = root_of(&c, &at);
                if (s == LH_OK) s = color_of(&c, at, &black);
                if (s == LH_OK && black != BLACK) s = LH_EABORTED;
                if (s == LH_OK) s = walk(&c, at, 0, UINT64_MAX, &bh, &count);
                if (s == LH_OK && count != m.count) s = LH_EABORTED;
                *value = count;
                break;
            }
        }
        if (s != LH_OK) {
            lh_tx_abort(c.tx);
            if (s == LH_CONFLICT) continue;
            return s;
        }
        s = lh_tx_commit(c.tx);
        if (s != LH_CONFLICT) return s;
    }
}

static uint64_t keys[KEYS], model[KEYS];

static void fail(const char *what) {
    fprintf(stderr, "FAIL: %s (%s)\n", what, lh_errormsg());
    exit(1);
}

static void verify(lh_pool_t *pool) {
    uint64_t count, present = 0;
    int found;
    if (run(pool, CHECK, 0, &count, &found) != LH_OK) fail("the red-black invariants");
    for (int k = 0; k < KEYS; k++) {
        uint64_t v = 0;
        if (run(pool, LOOKUP, keys[k], &v, &found) != LH_OK) fail("lookup");
        if (found != (model[k] != 0) || (found && v != model[k] - 1)) fail("a lookup's answer");
        present += model[k] != 0;
    }
    if (count != present) fail("the node count");
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: rbtree POOL ENGINE\n");
        return 2;
    }
    lh_pool_t *pool;
    if (lh_pool_create(argv[1], argv[2], 32 << 20, &pool) != LH_OK) fail("create");
    if (lh_pool_root(pool, &header, NULL) != LH_OK) fail("root");
    srand(7);
    for (int k = 0; k < KEYS; k++) keys[k] = ((uint64_t)rand() << 20) ^ (uint64_t)rand() ^ (uint64_t)k;
    int found;
    for (int k = 0; k < KEYS; k++) {
        uint64_t v = (uint64_t)k * 5;
        if (run(pool, INSERT, keys[k], &v, &found) != LH_OK) fail("insert");
        if (found != (model[k] != 0)) fail("insert's answer");
        model[k] = v + 1;
    }
    for (int k = 0; k < KEYS; k += 9) {
        uint64_t v = 123;
        if (run(pool, INSERT, keys[k], &v, &found) != LH_OK || !found) fail("replace");
        model[k] = 124;
    }
    verify(pool);
    for (int k = 0; k < KEYS; k += 2) {
        if (run(pool, REMOVE, keys[k], NULL, &found) != LH_OK) fail("remove");
        if (found != (model[k] != 0)) fail("remove's answer");
        model[k] = 0;
        if (k % 250 == 0) verify(pool);
    }
    verify(pool);
    if (lh_pool_close(pool) != LH_OK) fail("close");
    if (lh_pool_open(argv[1], &pool) != LH_OK) fail("reopen");
    if (lh_pool_root(pool, &header, NULL) != LH_OK) fail("root after reopen");
    verify(pool);
    if (lh_pool_close(pool) != LH_OK) fail("final close");
    puts("ok");
    return 0;
}
