/* A persistent B-tree map (u64 keys and values) on logheap's C API, after PMDK's
 * btree_map example: nodes of up to 7 items and 8 children; inserts split full nodes
 * on the way down, removes fill thin nodes on the way down (borrowing from or merging
 * with a sibling), as in Cormen et al.
 *
 * Usage: btree POOL ENGINE
 * Inserts 2,000 random keys, replaces some, removes half, checking each answer and
 * the tree's invariants against a model; closes, reopens and checks again.
 * Prints "ok" and exits 0, or names the first failure and exits 1. */

#include <logheap.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ORDER 8
#define MIN_ITEMS (ORDER / 2 - 1) /* 3: every node but the root keeps at least this */
#define KEYS 2000

struct item {
    uint64_t key, value;
};

struct node {
    uint64_t n; /* items in use */
    struct item items[ORDER - 1];
    lh_oid_t slots[ORDER]; /* children; slots[0].off == 0 in a leaf */
};

struct map {
    lh_oid_t root;
    uint64_t count;
};

static lh_oid_t root_oid;

#define TRY(call)                         \
    do {                                  \
        lh_status_t s_ = (call);          \
        if (s_ != LH_OK) return (int)s_;  \
    } while (0)

static int get_node(lh_tx_t *tx, lh_oid_t at, struct node *n) { return (int)lh_tx_read(tx, at, 0, n, sizeof *n); }
static int put_node(lh_tx_t *tx, lh_oid_t at, const struct node *n) { return (int)lh_tx_write(tx, at, 0, n, sizeof *n); }
static int get_map(lh_tx_t *tx, struct map *m) { return (int)lh_tx_read(tx, root_oid, 0, m, sizeof *m); }
static int put_map(lh_tx_t *tx, const struct map *m) { return (int)lh_tx_write(tx, root_oid, 0, m, sizeof *m); }

static int is_leaf(const struct node *n) { return n->slots[0].off == 0; }

/* Splits the full child `i` of `parent` (at `p`): its median moves up. */
static int split_child(lh_tx_t *tx, lh_oid_t p, struct node *parent, uint64_t i) {
    struct node full, right;
    TRY(get_node(tx, parent->slots[i], &full));
    memset(&right, 0, sizeof right);
    lh_oid_t r;
    TRY(lh_tx_alloc(tx, sizeof right, &r));
    const uint64_t mid = (ORDER - 1) / 2; /* 3 */
    right.n = full.n - mid - 1;
    memcpy(right.items, &full.items[mid + 1], right.n * sizeof(struct item));
    if (!is_leaf(&full)) memcpy(right.slots, &full.slots[mid + 1], (right.n + 1) * sizeof(lh_oid_t));
    struct item median = full.items[mid];
    full.n = mid;
    memset(&full.items[mid], 0, (ORDER - 1 - mid) * sizeof(struct item));
    memset(&full.slots[mid + 1], 0, (ORDER - 1 - mid) * sizeof(lh_oid_t));
    memmove(&parent->items[i + 1], &parent->items[i], (parent->n - i) * sizeof(struct item));
    memmove(&parent->slots[i + 2], &parent->slots[i + 1], (parent->n - i) * sizeof(lh_oid_t));
    parent->items[i] = median;
    parent->slots[i + 1] = r;
    parent->n++;
    TRY(put_node(tx, parent->slots[i], &full));
    TRY(put_node(tx, r, &right));
    return put_node(tx, p, parent);
}

struct op {
    uint64_t key, value;
    int found; /* out: whether the key was there */
};

static int insert(lh_tx_t *tx, void *argp) {
    struct op *op = argp;
    struct map m;
    TRY(get_map(tx, &m));
    op->found = 0;
    if (m.root.off == 0) {
        struct node n;
        memset(&n, 0, sizeof n);
        n.n = 1;
        n.items[0] = (struct item){op->key, op->value};
        TRY(lh_tx_alloc(tx, sizeof n, &m.root));
        TRY(put_node(tx, m.root, &n));
        m.count = 1;
        return put_map(tx, &m);
    }
    struct node n;
    TRY(get_node(tx, m.root, &n));
    if (n.n == ORDER - 1) { /* a full root: a new root above it */
        struct node top;
        memset(&top, 0, sizeof top);
        top.slots[0] = m.root;
        lh_oid_t t;
        TRY(lh_tx_alloc(tx, sizeof top, &t));
        TRY(split_child(tx, t, &top, 0));
        m.root = t;
        TRY(put_map(tx, &m));
        n = top;
    }
    lh_oid_t at = m.root;
    for (;;) {
        uint64_t i = 0;
        while (i < n.n && n.items[i].key < op->key) i++;
        if (i < n.n && n.items[i].key == op->key) {
            op->found = 1;
            n.items[i].value = op->value;
            return put_node(tx, at, &n);
        }
        if (is_leaf(&n)) {
            memmove(&n.items[i + 1], &n.items[i], (n.n - i) * sizeof(struct item));
            n.items[i] = (struct item){op->key, op->value};
            n.n++;
            TRY(put_node(tx, at, &n));
            m.count++;
            return put_map(tx, &m);
        }
        struct node child;
        TRY(get_node(tx, n.slots[i], &child));
        if (child.n == ORDER - 1) {
            TRY(split_child(tx, at, &n, i));
            if (n.items[i].key == op->key) continue; /* the median is the key */
            if (n.items[i].key < op->key) i++;
            TRY(get_node(tx, n.slots[i], &child));
        }
        at = n.slots[i];
        n = child;
    }
}

static int lookup(lh_tx_t *tx, void *argp) {
    struct op *op = argp;
    struct map m;
    TRY(get_map(tx, &m));
    op->found = 0;
    lh_oid_t at = m.root;
    while (at.off != 0) {
        struct node n;
        TRY(get_node(tx, at, &n));
        uint64_t i = 0;
        while (i < n.n && n.items[i].key < op->key) i++;
        if (i < n.n && n.items[i].key == op->key) {
            op->found = 1;
            op->value = n.items[i].value;
            return LH_OK;
        }
        at = is_leaf(&n) ? (lh_oid_t){0} : n.slots[i];
    }
    return LH_OK;
}

/* Merges child j+1 of `p` (node `n`) into child j around item j of `n`. */
static int merge_children(lh_tx_t *tx, lh_oid_t p, struct node *n, uint64_t j) {
    struct node left, right;
    TRY(get_node(tx, n->slots[j], &left));
    TRY(get_node(tx, n->slots[j + 1], &right));
    lh_oid_t gone = n->slots[j + 1];
    left.items[left.n] = n->items[j];
    memcpy(&left.items[left.n + 1], right.items, right.n * sizeof(struct item));
    memcpy(&left.slots[left.n + 1], right.slots, (right.n + 1) * sizeof(lh_oid_t));
    left.n += right.n + 1;
    memmove(&n->items[j], &n->items[j + 1], (n->n - j - 1) * sizeof(struct item));
    memmove(&n->slots[j + 1], &n->slots[j + 2], (n->n - j - 1) * sizeof(lh_oid_t));
    n->n--;
    n->items[n->n] = (struct item){0, 0};
    n->slots[n->n + 1] = (lh_oid_t){0};
    TRY(put_node(tx, n->slots[j], &left));
    TRY(lh_tx_free(tx, gone));
    return put_node(tx, p, n);
}

/* Makes child `i` of `p` (node `n`) hold more than MIN_ITEMS items, borrowing from a
 * sibling or merging with one; `n` and the children are rewritten. Returns the index
 * of the child the key now lies under (a merge with the left sibling moves it). */
static int fill_child(lh_tx_t *tx, lh_oid_t p, struct node *n, uint64_t i, uint64_t *under) {
    struct node c, s;
    TRY(get_node(tx, n->slots[i], &c));
    *under = i;
    if (i > 0) {
        TRY(get_node(tx, n->slots[i - 1], &s));
        if (s.n > MIN_ITEMS) { /* borrow from the left */
            memmove(&c.items[1], &c.items[0], c.n * sizeof(struct item));
            memmove(&c.slots[1], &c.slots[0], (c.n + 1) * sizeof(lh_oid_t));
            c.items[0] = n->items[i - 1];
            c.slots[0] = s.slots[s.n];
            n->items[i - 1] = s.items[s.n - 1];
            s.items[s.n - 1] = (struct item){0, 0};
            s.slots[s.n] = (lh_oid_t){0};
            s.n--;
            c.n++;
            TRY(put_node(tx, n->slots[i - 1], &s));
            TRY(put_node(tx, n->slots[i], &c));
            return put_node(tx, p, n);
        }
    }
    if (i < n->n) {
        TRY(get_node(tx, n->slots[i + 1], &s));
        if (s.n > MIN_ITEMS) { /* borrow from the right */
            c.items[c.n] = n->items[i];
            c.slots[c.n + 1] = s.slots[0];
            c.n++;
            n->items[i] = s.items[0];
            memmove(&s.items[0], &s.items[1], (s.n - 1) * sizeof(struct item));
            memmove(&s.slots[0], &s.slots[1], s.n * sizeof(lh_oid_t));
            s.n--;
            s.items[s.n] = (struct item){0, 0};
            s.slots[s.n + 1] = (lh_oid_t){0};
            TRY(put_node(tx, n->slots[i + 1], &s));
            TRY(put_node(tx, n->slots[i], &c));
            return put_node(tx, p, n);
        }
    }
    /* Merge with a sibling: the right one if there is one, else the left. */
    uint64_t j = i < n->n ? i : i - 1;
    *under = j;
    return merge_children(tx, p, n, j);
}

static int remove_key(lh_tx_t *tx, void *argp) {
    struct op *op = argp;
    struct map m;
    TRY(get_map(tx, &m));
    op->found = 0;
    if (m.root.off == 0) return LH_OK;
    lh_oid_t at = m.root;
    uint64_t key = op->key;
    for (;;) {
        struct node n;
        TRY(get_node(tx, at, &n));
        uint64_t i = 0;
        while (i < n.n && n.items[i].key < key) i++;
        int here = i < n.n && n.items[i].key == key;
        if (is_leaf(&n)) {
            if (here) {
                memmove(&n.items[i], &n.items[i + 1], (n.n - i - 1) * sizeof(struct item));
                n.n--;
                n.items[n.n] = (struct item){0, 0};
                TRY(put_node(tx, at, &n));
                if (!op->found) op->found = 1;
                m.count--;
            }
            break;
        }
        if (here) {
            struct node l, r;
            TRY(get_node(tx, n.slots[i], &l));
            TRY(get_node(tx, n.slots[i + 1], &r));
            if (l.n > MIN_ITEMS || r.n > MIN_ITEMS) {
                /* Replace the key by its predecessor (or successor), then remove that. */
                int from_left = l.n > MIN_ITEMS;
                lh_oid_t c = n.slots[from_left ? i : i + 1];
                struct node d;
                TRY(get_node(tx, c, &d));
                while (!is_leaf(&d)) TRY(get_node(tx, d.slots[from_left ? d.n : 0], &d));
                struct item repl = from_left ? d.items[d.n - 1] : d.items[0];
                n.items[i] = repl;
                TRY(put_node(tx, at, &n));
                op->found = 1;
                /* Go on removing `repl` in the child (a subtree with room to spare). */
                key = repl.key;
                at = c;
                continue;
            }
            /* Both children are thin: merge them around the key, then go down. */
            TRY(merge_children(tx, at, &n, i));
            at = n.slots[i];
            if (n.n == 0) { /* the root emptied: its only child is the root now */
                TRY(lh_tx_free(tx, m.root));
                m.root = at;
            }
            continue;
        }
        struct node c;
        TRY(get_node(tx, n.slots[i], &c));
        uint64_t under = i;
        if (c.n <= MIN_ITEMS) TRY(fill_child(tx, at, &n, i, &under));
        lh_oid_t next = n.slots[under];
        if (n.n == 0) {
            TRY(lh_tx_free(tx, at));
            m.root = next;
        }
        at = next;
    }
    if (m.count == 0 && m.root.off != 0) {
        TRY(lh_tx_free(tx, m.root));
        m.root = (lh_oid_t){0};
    }
    return put_map(tx, &m);
}

/* Checks the tree: order, item counts, equal leaf depth; returns its item count. */
struct walk {
    uint64_t items;
    int leaf_depth;
    uint64_t last;
    int any;
};

static int walk_node(lh_tx_t *tx, lh_oid_t at, int depth, int is_root, struct walk *w) {
    struct node n;
    TRY(get_node(tx, at, &n));
    if (n.n > ORDER - 1 || (!is_root && n.n < MIN_ITEMS)) return LH_EABORTED;
    for (uint64_t i = 0; i <= n.n; i++) {
        if (!is_leaf(&n)) TRY(walk_node(tx, n.slots[i], depth + 1, 0, w));
        if (i < n.n) {
            if (w->any && n.items[i].key <= w->last) return LH_EABORTED;
            w->last = n.items[i].key;
            w->any = 1;
            w->items++;
        }
    }
    if (is_leaf(&n)) {
        if (w->leaf_depth < 0) w->leaf_depth = depth;
        else if (w->leaf_depth != depth) return LH_EABORTED;
    }
    return LH_OK;
}

static int check_tree(lh_tx_t *tx, void *argp) {
    struct walk *w = argp;
    struct map m;
    TRY(get_map(tx, &m));
    *w = (struct walk){0, -1, 0, 0};
    if (m.root.off != 0) TRY(walk_node(tx, m.root, 0, 1, w));
    return w->items == m.count ? LH_OK : LH_EABORTED;
}

static uint64_t model[KEYS]; /* value + 1, or 0 when absent */
static uint64_t keys[KEYS];

static void fail(const char *what) {
    fprintf(stderr, "FAIL: %s (%s)\n", what, lh_errormsg());
    exit(1);
}

static void verify(lh_pool_t *pool) {
    struct walk w;
    if (lh_pool_transaction(pool, LH_TX_READONLY, check_tree, &w) != LH_OK) fail("the tree's invariants");
    uint64_t present = 0;
    for (int k = 0; k < KEYS; k++) {
        struct op op = {keys[k], 0, 0};
        if (lh_pool_transaction(pool, LH_TX_READONLY, lookup, &op) != LH_OK) fail("lookup");
        if (op.found != (model[k] != 0) || (op.found && op.value != model[k] - 1)) fail("a lookup's answer");
        present += model[k] != 0;
    }
    if (w.items != present) fail("the item count");
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: btree POOL ENGINE\n");
        return 2;
    }
    lh_pool_t *pool;
    if (lh_pool_create(argv[1], argv[2], 32 << 20, &pool) != LH_OK) fail("create");
    if (lh_pool_root(pool, &root_oid, NULL) != LH_OK) fail("root");
    srand(42);
    for (int k = 0; k < KEYS; k++) keys[k] = ((uint64_t)rand() << 20) ^ (uint64_t)rand() ^ (uint64_t)k;
    for (int k = 0; k < KEYS; k++) {
        struct op op = {keys[k], (uint64_t)k * 3, 0};
        if (lh_pool_transaction(pool, 0, insert, &op) != LH_OK) fail("insert");
        if (op.found != (model[k] != 0)) fail("insert's answer");
        model[k] = op.value + 1;
    }
    for (int k = 0; k < KEYS; k += 7) { /* replace some */
        struct op op = {keys[k], 77, 0};
        if (lh_pool_transaction(pool, 0, insert, &op) != LH_OK || !op.found) fail("replace");
        model[k] = 78;
    }
    verify(pool);
    for (int k = 0; k < KEYS; k += 2) {
        struct op op = {keys[k], 0, 0};
        if (lh_pool_transaction(pool, 0, remove_key, &op) != LH_OK) fail("remove");
        if (op.found != (model[k] != 0)) fail("remove's answer");
        model[k] = 0;
        if (k % 200 == 0) verify(pool);
    }
    verify(pool);
    if (lh_pool_close(pool) != LH_OK) fail("close");
    if (lh_pool_open(argv[1], &pool) != LH_OK) fail("reopen");
    if (lh_pool_root(pool, &root_oid, NULL) != LH_OK) fail("root after reopen");
    verify(pool);
    /* Empty it: every node is freed. */
    for (int k = 0; k < KEYS; k++) {
        struct op op = {keys[k], 0, 0};
        if (lh_pool_transaction(pool, 0, remove_key, &op) != LH_OK) fail("remove all");
        model[k] = 0;
    }
    verify(pool);
    lh_stats_t stats;
    if (lh_pool_stats(pool, &stats) != LH_OK || stats.allocations != 0) fail("an empty tree holds no node");
    if (lh_pool_close(pool) != LH_OK) fail("final close");
    puts("ok");
    return 0;
}
