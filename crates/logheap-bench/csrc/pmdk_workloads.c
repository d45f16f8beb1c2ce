/*
 * The workloads of logheap's benchmark on PMDK's libpmemobj: the peer engine `pmdk` of
 * `logheap bench`.
 *
 * Each structure mirrors the one in crates/logheap-collections on logheap, node layout
 * and algorithm alike, so that the two engines do the same work per operation:
 *
 *  - SPS: an array of 8-byte elements; an operation swaps two of them.
 *  - a red-black tree (CLRS with a persistent nil sentinel), values out of line as
 *    {len, bytes} objects;
 *  - a B+ tree of fanout 16 (insertion splits full nodes on the way down, deletion
 *    borrows or merges on the way down), values out of line, a node written back as the
 *    8-byte words that changed;
 *  - a chained hash table with a fixed number of buckets (the caller passes logheap's:
 *    the element count rounded up to a power of two), values inline after the entry;
 *    the key-value store is the same table with variable-size values.
 *
 * Persistent pointers are 8-byte pool offsets, as in logheap's collections (a PMEMoid's
 * `off`; the pool's `pool_uuid_lo` is the same for every object of the pool): an address
 * is the pool's base plus the offset, which is what pmemobj_direct() computes.
 *
 * Every operation is one libpmemobj transaction (TX_BEGIN ... TX_END): every persistent
 * range it changes is added to the transaction's undo log first (TX_ADD_FIELD_DIRECT /
 * pmemobj_tx_add_range_direct) and every object it allocates or frees goes through
 * pmemobj_tx_alloc / pmemobj_tx_zalloc / pmemobj_tx_free (what TX_ALLOC, TX_ZNEW and
 * TX_FREE expand to). Objects allocated in the running transaction are written without
 * being added: they vanish if it aborts.
 *
 * The read-heavy workloads' look-ups (hashtable-read95, rbtree-read95, hashtable-lookup,
 * rbtree-lookup) run outside any transaction, as a PMDK user reads: a walk of the
 * structure through direct pointers into the pool (base + offset), and a memcpy of the
 * value found out of it (what logheap's `get` returns). libpmemobj instruments no read.
 *
 * Concurrency: libpmemobj transactions give atomicity and durability, not isolation, so
 * concurrent operations are serialised by locks in DRAM, taken before TX_BEGIN and
 * released after TX_END (after the commit is durable):
 *  - the trees: one mutex per tree. Every operation takes it exclusively, look-ups too:
 *    an update operation decides between delete and insert after its look-up, so a
 *    reader lock would have to be upgraded; and both rebalancing schemes may touch the
 *    root, so finer locking would serialise on it anyway. In the read-mostly mode
 *    (`-read95`) the tree's lock is a reader-writer lock instead: look-ups take it
 *    shared, updates exclusively.
 *  - the hash table: lock striping. Bucket b belongs to stripe b % STRIPES (buckets and
 *    stripes are powers of two); an operation locks its key's stripe, which covers the
 *    bucket's chain and one slot of the entry count (the count is kept per stripe, one
 *    64-byte line each, summed when read: a single word would need a global lock).
 *  - SPS: stripes of elements, element i in stripe i % STRIPES; a swap locks the stripes
 *    of both elements in increasing order (once when they are the same), so two swaps
 *    never deadlock.
 *  - the hash table's look-ups in the read-mostly mode lock their key's stripe, as its
 *    updates do.
 *  - look-ups only (`-lookup`): nothing writes while they run, so they take no lock.
 * The preload runs on one thread and takes no lock.
 */

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpmemobj.h>

/* --- The interface (crates/logheap-bench/src/pmdk.rs declares the same) --------------- */

/* What kind of structure a pool holds. */
enum lh_kind { LH_SPS = 0, LH_RBTREE = 1, LH_BPTREE = 2, LH_HASH = 3 };

/*
 * What the measured phase's operations do: insert; update (look the key up, remove it
 * if present, else insert it); read-mostly (an operation whose `other` is LH_OP_UPDATE
 * is an update, the others look-ups); look-ups only.
 */
enum lh_mode { LH_INSERT = 0, LH_UPDATE = 1, LH_READ_MOSTLY = 2, LH_LOOKUP_ONLY = 3 };

/* `other` of a read-heavy workload's update (Rust's `Op::UPDATE`; 0 is a look-up). */
#define LH_OP_UPDATE 1u

/*
 * One operation (Rust's `logheap_bench::workload::Op`, #[repr(C)]): SPS swaps elements
 * `key` and `other` (the preload sets element `key` to `key`); the other structures
 * insert `key` with a value of `len` bytes all equal to `fill`, or, in an update
 * workload's measured phase, remove `key` if present and insert it otherwise; in a
 * read-heavy workload's, look `key` up (`other` 0) or update it (`other` LH_OP_UPDATE).
 */
struct lh_op {
	uint64_t key;
	uint64_t other;
	uint64_t len;
	uint8_t fill;
};

/* What look-ups found (Rust's `logheap_bench::workload::Lookups`, #[repr(C)]): look-ups
 * run, those that found their key, and the sum of the first bytes of the values found. */
struct lh_lookups {
	uint64_t lookups;
	uint64_t found;
	uint64_t fill_sum;
};

/* Lock stripes of the hash table and of SPS (at most: never more than buckets). */
#define STRIPES 1024u
/* Count slots are spaced one cache line apart. */
#define COUNT_SPACING 8u

/* Object type numbers (what TOID_DECLARE would assign). */
enum { T_ROOT = 1, T_ARRAY, T_RB_NODE, T_BP_NODE, T_VALUE, T_HASH_ENTRY, T_TABLE, T_HEADER };

struct stripe_lock {
	pthread_mutex_t m;
	char pad[64 - sizeof(pthread_mutex_t) % 64];
};

/* A pool holding one structure, and its volatile locks. */
struct lh_ctx {
	PMEMobjpool *pop;
	char *base;
	uint64_t uuid_lo;
	int kind;
	/* enum lh_mode */
	int mode;
	/* Offset of the structure's header. */
	uint64_t header;
	/* Trees: the tree's lock (the reader-writer one in the read-mostly mode). */
	pthread_mutex_t tree_lock;
	pthread_rwlock_t tree_rwlock;
	/* Hash table and SPS: lock stripes. */
	struct stripe_lock *stripes;
	uint64_t nstripes;
};

/* The pool's root object. */
struct lh_root {
	uint64_t kind;
	uint64_t header;
};

#define P(c, off) ((void *)((c)->base + (off)))

static PMEMoid oid_of(const struct lh_ctx *c, uint64_t off)
{
	PMEMoid oid = {c->uuid_lo, off};
	return oid;
}

/* Sets a persistent word, adding it to the transaction first. */
static void set_u64(uint64_t *p, uint64_t v)
{
	pmemobj_tx_add_range_direct(p, sizeof(*p));
	*p = v;
}

/* Allocates in the transaction (aborts it, and does not return, on failure). */
static uint64_t tx_alloc(size_t size, uint64_t type)
{
	return pmemobj_tx_alloc(size, type).off;
}

static uint64_t tx_zalloc(size_t size, uint64_t type)
{
	return pmemobj_tx_zalloc(size, type).off;
}

static void tx_free(const struct lh_ctx *c, uint64_t off)
{
	pmemobj_tx_free(oid_of(c, off));
}

/* --- Values out of line: {len, bytes} objects (the trees') --------------------------- */

struct value_obj {
	uint64_t len;
	uint8_t bytes[];
};

static uint64_t value_create(struct lh_ctx *c, uint64_t len, uint8_t fill)
{
	uint64_t at = tx_alloc(sizeof(struct value_obj) + len, T_VALUE);
	struct value_obj *v = P(c, at);
	v->len = len;
	memset(v->bytes, fill, len);
	return at;
}

/* Puts the value in the object at `at`: in place when the length is the same, else in a
 * new object (the old one is freed). Returns where the value now is. */
static uint64_t value_replace(struct lh_ctx *c, uint64_t at, uint64_t len, uint8_t fill)
{
	struct value_obj *v = P(c, at);
	if (v->len == len) {
		pmemobj_tx_add_range_direct(v->bytes, len);
		memset(v->bytes, fill, len);
		return at;
	}
	uint64_t fresh = value_create(c, len, fill);
	tx_free(c, at);
	return fresh;
}

/* --- SPS: an array of 8-byte elements -------------------------------------------------- */

struct array_header {
	uint64_t len;
	uint64_t element_size;
	uint64_t data;
};

static uint64_t *array_data(struct lh_ctx *c)
{
	struct array_header *h = P(c, c->header);
	return P(c, h->data);
}

static void sps_swap(struct lh_ctx *c, uint64_t i, uint64_t j)
{
	uint64_t *a = array_data(c);
	uint64_t x = a[i], y = a[j];
	set_u64(&a[i], y);
	set_u64(&a[j], x);
}

/* --- Red-black tree -------------------------------------------------------------------- */

struct rb_header {
	uint64_t root;
	uint64_t nil;
	uint64_t count;
};

struct rb_node {
	uint64_t key;
	uint64_t child[2];
	uint64_t parent;
	uint64_t red;
	uint64_t value;
};

enum { LEFT = 0, RIGHT = 1 };

#define RB(c, n) ((struct rb_node *)P(c, n))
#define RBH(c) ((struct rb_header *)P(c, (c)->header))

static void rb_set_child(struct lh_ctx *c, uint64_t n, int d, uint64_t v)
{
	set_u64(&RB(c, n)->child[d], v);
}

static void rb_set_parent(struct lh_ctx *c, uint64_t n, uint64_t v)
{
	if (RB(c, n)->parent != v)
		set_u64(&RB(c, n)->parent, v);
}

static int rb_is_red(struct lh_ctx *c, uint64_t n)
{
	return RB(c, n)->red == 1;
}

static void rb_set_red(struct lh_ctx *c, uint64_t n, int red)
{
	/* Colours are often rewritten unchanged (the root, nil): skip those. */
	if (rb_is_red(c, n) != red)
		set_u64(&RB(c, n)->red, (uint64_t)red);
}

static void rb_set_root(struct lh_ctx *c, uint64_t v)
{
	set_u64(&RBH(c)->root, v);
}

/* Which side of its parent `n` is on. */
static int rb_side(struct lh_ctx *c, uint64_t n)
{
	uint64_t p = RB(c, n)->parent;
	return RB(c, p)->child[LEFT] == n ? LEFT : RIGHT;
}

/* Puts `v` where `u` was under `u`'s parent (or as root). */
static void rb_transplant(struct lh_ctx *c, uint64_t u, uint64_t v)
{
	uint64_t p = RB(c, u)->parent;
	if (p == RBH(c)->nil)
		rb_set_root(c, v);
	else
		rb_set_child(c, p, rb_side(c, u), v);
	rb_set_parent(c, v, p);
}

/* Rotates `x` down in direction `d` (LEFT: its right child rises). */
static void rb_rotate(struct lh_ctx *c, uint64_t x, int d)
{
	uint64_t nil = RBH(c)->nil;
	uint64_t y = RB(c, x)->child[1 - d];
	uint64_t inner = RB(c, y)->child[d];
	rb_set_child(c, x, 1 - d, inner);
	if (inner != nil)
		rb_set_parent(c, inner, x);
	rb_transplant(c, x, y);
	rb_set_child(c, y, d, x);
	rb_set_parent(c, x, y);
}

static uint64_t rb_find(struct lh_ctx *c, uint64_t key)
{
	uint64_t nil = RBH(c)->nil;
	uint64_t x = RBH(c)->root;
	while (x != nil) {
		uint64_t k = RB(c, x)->key;
		if (key == k)
			return x;
		x = RB(c, x)->child[key > k];
	}
	return 0;
}

static void rb_insert_fixup(struct lh_ctx *c, uint64_t z)
{
	for (;;) {
		uint64_t p = RB(c, z)->parent;
		if (!rb_is_red(c, p))
			break;
		uint64_t g = RB(c, p)->parent;
		int d = rb_side(c, p);
		uint64_t uncle = RB(c, g)->child[1 - d];
		if (rb_is_red(c, uncle)) {
			rb_set_red(c, p, 0);
			rb_set_red(c, uncle, 0);
			rb_set_red(c, g, 1);
			z = g;
		} else {
			if (RB(c, p)->child[1 - d] == z) {
				z = p;
				rb_rotate(c, z, d);
			}
			p = RB(c, z)->parent;
			g = RB(c, p)->parent;
			rb_set_red(c, p, 0);
			rb_set_red(c, g, 1);
			rb_rotate(c, g, 1 - d);
		}
	}
	rb_set_red(c, RBH(c)->root, 0);
}

static void rb_delete_fixup(struct lh_ctx *c, uint64_t x)
{
	while (x != RBH(c)->root && !rb_is_red(c, x)) {
		uint64_t p = RB(c, x)->parent;
		int d = RB(c, p)->child[LEFT] == x ? LEFT : RIGHT;
		uint64_t w = RB(c, p)->child[1 - d];
		if (rb_is_red(c, w)) {
			rb_set_red(c, w, 0);
			rb_set_red(c, p, 1);
			rb_rotate(c, p, d);
			w = RB(c, p)->child[1 - d];
		}
		uint64_t near = RB(c, w)->child[d];
		uint64_t far = RB(c, w)->child[1 - d];
		if (!rb_is_red(c, near) && !rb_is_red(c, far)) {
			rb_set_red(c, w, 1);
			x = p;
		} else {
			if (!rb_is_red(c, far)) {
				rb_set_red(c, near, 0);
				rb_set_red(c, w, 1);
				rb_rotate(c, w, 1 - d);
				w = RB(c, p)->child[1 - d];
			}
			rb_set_red(c, w, rb_is_red(c, p));
			rb_set_red(c, p, 0);
			rb_set_red(c, RB(c, w)->child[1 - d], 0);
			rb_rotate(c, p, d);
			x = RBH(c)->root;
		}
	}
	rb_set_red(c, x, 0);
}

static void rb_insert(struct lh_ctx *c, uint64_t key, uint64_t len, uint8_t fill)
{
	uint64_t nil = RBH(c)->nil;
	uint64_t y = nil;
	uint64_t x = RBH(c)->root;
	while (x != nil) {
		y = x;
		uint64_t k = RB(c, x)->key;
		if (key == k) {
			uint64_t old = RB(c, x)->value;
			uint64_t now = value_replace(c, old, len, fill);
			if (now != old)
				set_u64(&RB(c, x)->value, now);
			return;
		}
		x = RB(c, x)->child[key > k];
	}
	uint64_t value = value_create(c, len, fill);
	uint64_t z = tx_alloc(sizeof(struct rb_node), T_RB_NODE);
	struct rb_node *zn = RB(c, z);
	zn->key = key;
	zn->child[LEFT] = nil;
	zn->child[RIGHT] = nil;
	zn->parent = y;
	zn->red = 1;
	zn->value = value;
	if (y == nil)
		rb_set_root(c, z);
	else
		rb_set_child(c, y, key > RB(c, y)->key, z);
	rb_insert_fixup(c, z);
	set_u64(&RBH(c)->count, RBH(c)->count + 1);
}

static uint64_t rb_minimum(struct lh_ctx *c, uint64_t x)
{
	uint64_t nil = RBH(c)->nil;
	while (RB(c, x)->child[LEFT] != nil)
		x = RB(c, x)->child[LEFT];
	return x;
}

static void rb_remove_node(struct lh_ctx *c, uint64_t z)
{
	uint64_t nil = RBH(c)->nil;
	int removed_red = rb_is_red(c, z);
	uint64_t x;
	uint64_t zl = RB(c, z)->child[LEFT];
	uint64_t zr = RB(c, z)->child[RIGHT];
	if (zl == nil) {
		x = zr;
		rb_transplant(c, z, zr);
	} else if (zr == nil) {
		x = zl;
		rb_transplant(c, z, zl);
	} else {
		uint64_t y = rb_minimum(c, zr);
		removed_red = rb_is_red(c, y);
		x = RB(c, y)->child[RIGHT];
		if (RB(c, y)->parent == z) {
			rb_set_parent(c, x, y);
		} else {
			rb_transplant(c, y, x);
			rb_set_child(c, y, RIGHT, zr);
			rb_set_parent(c, zr, y);
		}
		rb_transplant(c, z, y);
		rb_set_child(c, y, LEFT, zl);
		rb_set_parent(c, zl, y);
		rb_set_red(c, y, rb_is_red(c, z));
	}
	if (!removed_red)
		rb_delete_fixup(c, x);
	tx_free(c, RB(c, z)->value);
	tx_free(c, z);
	set_u64(&RBH(c)->count, RBH(c)->count - 1);
}

/* --- B+ tree --------------------------------------------------------------------------- */

/* Most keys in a node (logheap's BpTree: fanout 16). */
#define BP_MAX 16
/* Fewest keys in a non-root node. */
#define BP_MIN ((BP_MAX - 1) / 2)

struct bp_header {
	uint64_t root;
	uint64_t count;
};

/*
 * Leaves: ptrs[..count] are value objects, `next` the next leaf. Inner nodes:
 * ptrs[..=count] are children; ptrs[i] holds keys below keys[i], ptrs[i + 1] keys from
 * keys[i] up.
 */
struct bp_node {
	uint64_t leaf;
	uint64_t count;
	uint64_t next;
	uint64_t keys[BP_MAX];
	uint64_t ptrs[BP_MAX + 1];
};

#define BPN(c, at) ((struct bp_node *)P(c, at))
#define BPH(c) ((struct bp_header *)P(c, (c)->header))

static size_t bp_n(const struct bp_node *n)
{
	return n->count < BP_MAX ? (size_t)n->count : BP_MAX;
}

/* The child to descend into for `key`: the number of keys <= key. */
static size_t bp_child_index(const struct bp_node *n, uint64_t key)
{
	size_t lo = 0, hi = bp_n(n);
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (n->keys[mid] <= key)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Where `key` is among the keys (1, *at = index) or would go (0, *at = position). */
static int bp_search(const struct bp_node *n, uint64_t key, size_t *at)
{
	size_t lo = 0, hi = bp_n(n);
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (n->keys[mid] < key)
			lo = mid + 1;
		else
			hi = mid;
	}
	*at = lo;
	return lo < bp_n(n) && n->keys[lo] == key;
}

static void bp_insert_key(struct bp_node *n, size_t at, uint64_t key, uint64_t ptr, size_t ptr_at)
{
	size_t cnt = bp_n(n);
	memmove(&n->keys[at + 1], &n->keys[at], (cnt - at) * sizeof(uint64_t));
	n->keys[at] = key;
	size_t ptrs = n->leaf ? cnt : cnt + 1;
	memmove(&n->ptrs[ptr_at + 1], &n->ptrs[ptr_at], (ptrs - ptr_at) * sizeof(uint64_t));
	n->ptrs[ptr_at] = ptr;
	n->count++;
}

static void bp_remove_key(struct bp_node *n, size_t at, size_t ptr_at)
{
	size_t cnt = bp_n(n);
	size_t ptrs = n->leaf ? cnt : cnt + 1;
	memmove(&n->keys[at], &n->keys[at + 1], (cnt - at - 1) * sizeof(uint64_t));
	memmove(&n->ptrs[ptr_at], &n->ptrs[ptr_at + 1], (ptrs - ptr_at - 1) * sizeof(uint64_t));
	n->count--;
}

/* Writes the 8-byte words of `now` that differ from `old` (runs of them at once). */
static void bp_write_node(struct lh_ctx *c, uint64_t at, const struct bp_node *old,
		const struct bp_node *now)
{
	const uint64_t *a = (const uint64_t *)old;
	const uint64_t *b = (const uint64_t *)now;
	uint64_t *dst = P(c, at);
	size_t words = sizeof(struct bp_node) / sizeof(uint64_t);
	size_t w = 0;
	while (w < words) {
		if (a[w] == b[w]) {
			w++;
			continue;
		}
		size_t start = w;
		while (w < words && a[w] != b[w])
			w++;
		pmemobj_tx_add_range_direct(&dst[start], (w - start) * sizeof(uint64_t));
		memcpy(&dst[start], &b[start], (w - start) * sizeof(uint64_t));
	}
}

static uint64_t bp_new_node(struct lh_ctx *c, const struct bp_node *n)
{
	uint64_t at = tx_alloc(sizeof(struct bp_node), T_BP_NODE);
	memcpy(P(c, at), n, sizeof(*n));
	return at;
}

/* Splits the full child `i` of `parent` (both already read), writing all three. */
static void bp_split_child(struct lh_ctx *c, uint64_t parent_at, struct bp_node *parent, size_t i)
{
	struct bp_node old_parent = *parent;
	uint64_t child_at = parent->ptrs[i];
	struct bp_node old_child = *BPN(c, child_at);
	struct bp_node child = old_child;
	struct bp_node sibling;
	memset(&sibling, 0, sizeof(sibling));
	sibling.leaf = child.leaf;
	uint64_t separator;
	if (child.leaf) {
		size_t half = BP_MAX / 2;
		memcpy(sibling.keys, &child.keys[half], (BP_MAX - half) * sizeof(uint64_t));
		memcpy(sibling.ptrs, &child.ptrs[half], (BP_MAX - half) * sizeof(uint64_t));
		sibling.count = BP_MAX - half;
		sibling.next = child.next;
		child.count = half;
		separator = sibling.keys[0];
	} else {
		size_t mid = BP_MAX / 2;
		separator = child.keys[mid];
		memcpy(sibling.keys, &child.keys[mid + 1], (BP_MAX - mid - 1) * sizeof(uint64_t));
		memcpy(sibling.ptrs, &child.ptrs[mid + 1], (BP_MAX - mid) * sizeof(uint64_t));
		sibling.count = BP_MAX - mid - 1;
		child.count = mid;
	}
	uint64_t sibling_at = bp_new_node(c, &sibling);
	if (child.leaf)
		child.next = sibling_at;
	bp_write_node(c, child_at, &old_child, &child);
	bp_insert_key(parent, i, separator, sibling_at, i + 1);
	bp_write_node(c, parent_at, &old_parent, parent);
}

static void bp_insert(struct lh_ctx *c, uint64_t key, uint64_t len, uint8_t fill)
{
	struct bp_header *h = BPH(c);
	uint64_t new_root = h->root;
	uint64_t at = h->root;
	struct bp_node node = *BPN(c, at);
	if (bp_n(&node) == BP_MAX) {
		struct bp_node root;
		memset(&root, 0, sizeof(root));
		root.ptrs[0] = at;
		uint64_t root_at = bp_new_node(c, &root);
		bp_split_child(c, root_at, &root, 0);
		new_root = root_at;
		at = root_at;
		node = root;
	}
	while (!node.leaf) {
		size_t i = bp_child_index(&node, key);
		if (bp_n(BPN(c, node.ptrs[i])) == BP_MAX) {
			bp_split_child(c, at, &node, i);
			i = bp_child_index(&node, key);
		}
		at = node.ptrs[i];
		node = *BPN(c, at);
	}
	size_t i;
	if (bp_search(&node, key, &i)) {
		uint64_t old = node.ptrs[i];
		uint64_t now = value_replace(c, old, len, fill);
		if (now != old)
			set_u64(&BPN(c, at)->ptrs[i], now);
	} else {
		struct bp_node old = node;
		uint64_t v = value_create(c, len, fill);
		bp_insert_key(&node, i, key, v, i);
		bp_write_node(c, at, &old, &node);
		set_u64(&h->count, h->count + 1);
	}
	if (h->root != new_root)
		set_u64(&h->root, new_root);
}

/* Merges child `j + 1` of `parent` into child `j` and frees it. */
static void bp_merge(struct lh_ctx *c, uint64_t parent_at, struct bp_node *parent, size_t j)
{
	struct bp_node old_parent = *parent;
	uint64_t l_at = parent->ptrs[j], r_at = parent->ptrs[j + 1];
	struct bp_node old_l = *BPN(c, l_at);
	struct bp_node r = *BPN(c, r_at);
	struct bp_node l = old_l;
	size_t ln = bp_n(&l), rn = bp_n(&r);
	if (l.leaf) {
		memcpy(&l.keys[ln], r.keys, rn * sizeof(uint64_t));
		memcpy(&l.ptrs[ln], r.ptrs, rn * sizeof(uint64_t));
		l.count = ln + rn;
		l.next = r.next;
	} else {
		l.keys[ln] = parent->keys[j];
		memcpy(&l.keys[ln + 1], r.keys, rn * sizeof(uint64_t));
		memcpy(&l.ptrs[ln + 1], r.ptrs, (rn + 1) * sizeof(uint64_t));
		l.count = ln + 1 + rn;
	}
	bp_remove_key(parent, j, j + 1);
	bp_write_node(c, l_at, &old_l, &l);
	bp_write_node(c, parent_at, &old_parent, parent);
	tx_free(c, r_at);
}

/* Makes child `i` of `parent` hold more than BP_MIN keys, by borrowing from or merging
 * with a sibling. */
static void bp_fill_child(struct lh_ctx *c, uint64_t parent_at, struct bp_node *parent, size_t i)
{
	struct bp_node old_parent = *parent;
	uint64_t c_at = parent->ptrs[i];
	struct bp_node old_c = *BPN(c, c_at);
	struct bp_node ch = old_c;
	size_t n = bp_n(parent);
	if (i > 0) {
		uint64_t l_at = parent->ptrs[i - 1];
		struct bp_node old_l = *BPN(c, l_at);
		if (bp_n(&old_l) > BP_MIN) {
			struct bp_node l = old_l;
			size_t ln = bp_n(&l);
			if (ch.leaf) {
				bp_insert_key(&ch, 0, l.keys[ln - 1], l.ptrs[ln - 1], 0);
				l.count--;
				parent->keys[i - 1] = ch.keys[0];
			} else {
				bp_insert_key(&ch, 0, parent->keys[i - 1], l.ptrs[ln], 0);
				parent->keys[i - 1] = l.keys[ln - 1];
				l.count--;
			}
			bp_write_node(c, l_at, &old_l, &l);
			bp_write_node(c, c_at, &old_c, &ch);
			bp_write_node(c, parent_at, &old_parent, parent);
			return;
		}
	}
	if (i < n) {
		uint64_t r_at = parent->ptrs[i + 1];
		struct bp_node old_r = *BPN(c, r_at);
		if (bp_n(&old_r) > BP_MIN) {
			struct bp_node r = old_r;
			size_t cn = bp_n(&ch);
			if (ch.leaf) {
				ch.keys[cn] = r.keys[0];
				ch.ptrs[cn] = r.ptrs[0];
				ch.count++;
				bp_remove_key(&r, 0, 0);
				parent->keys[i] = r.keys[0];
			} else {
				ch.keys[cn] = parent->keys[i];
				ch.ptrs[cn + 1] = r.ptrs[0];
				ch.count++;
				parent->keys[i] = r.keys[0];
				bp_remove_key(&r, 0, 0);
			}
			bp_write_node(c, r_at, &old_r, &r);
			bp_write_node(c, c_at, &old_c, &ch);
			bp_write_node(c, parent_at, &old_parent, parent);
			return;
		}
		bp_merge(c, parent_at, parent, i);
		return;
	}
	bp_merge(c, parent_at, parent, i - 1);
}

static int bp_contains(struct lh_ctx *c, uint64_t key, uint64_t *value)
{
	uint64_t at = BPH(c)->root;
	while (!BPN(c, at)->leaf)
		at = BPN(c, at)->ptrs[bp_child_index(BPN(c, at), key)];
	size_t i;
	if (!bp_search(BPN(c, at), key, &i))
		return 0;
	if (value)
		*value = BPN(c, at)->ptrs[i];
	return 1;
}

static void bp_remove(struct lh_ctx *c, uint64_t key)
{
	struct bp_header *h = BPH(c);
	uint64_t new_root = h->root;
	uint64_t at = h->root;
	struct bp_node node = *BPN(c, at);
	while (!node.leaf) {
		size_t i = bp_child_index(&node, key);
		if (bp_n(BPN(c, node.ptrs[i])) <= BP_MIN) {
			bp_fill_child(c, at, &node, i);
			/* Separators moved or children merged: choose again. */
			i = bp_child_index(&node, key);
		}
		if (at == new_root && bp_n(&node) == 0) {
			/* The root lost its last key in a merge: its only child is the new root. */
			new_root = node.ptrs[0];
			tx_free(c, at);
		}
		at = node.ptrs[i];
		node = *BPN(c, at);
	}
	size_t i;
	if (bp_search(&node, key, &i)) {
		struct bp_node old = node;
		tx_free(c, node.ptrs[i]);
		bp_remove_key(&node, i, i);
		bp_write_node(c, at, &old, &node);
		set_u64(&h->count, h->count - 1);
	}
	if (h->root != new_root)
		set_u64(&h->root, new_root);
}

/* --- Hash table -------------------------------------------------------------------------- */

struct hash_header {
	uint64_t buckets;
	/* Offset of the entry count: one slot per lock stripe, COUNT_SPACING words apart. */
	uint64_t counts;
	/* Offset of the bucket array (`buckets` offsets of chain heads). */
	uint64_t table;
	uint64_t stripes;
};

/* A chain entry: key, next entry, value length; the value bytes follow. */
struct hash_entry {
	uint64_t key;
	uint64_t next;
	uint64_t len;
	uint8_t bytes[];
};

#define HH(c) ((struct hash_header *)P(c, (c)->header))
#define HE(c, at) ((struct hash_entry *)P(c, at))

/* logheap's HashMap bucket function (splitmix64's finaliser). */
static uint64_t bucket_of(uint64_t key, uint64_t buckets)
{
	uint64_t x = key + 0x9E3779B97F4A7C15ull;
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
	x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
	return (x ^ (x >> 31)) % buckets;
}

static uint64_t *hash_slot(struct lh_ctx *c, uint64_t key)
{
	struct hash_header *h = HH(c);
	uint64_t *table = P(c, h->table);
	return &table[bucket_of(key, h->buckets)];
}

static uint64_t *hash_count_slot(struct lh_ctx *c, uint64_t key)
{
	struct hash_header *h = HH(c);
	uint64_t *counts = P(c, h->counts);
	uint64_t stripe = bucket_of(key, h->buckets) % h->stripes;
	return &counts[stripe * COUNT_SPACING];
}

/* Finds `key`: the link (bucket slot or an entry's `next`) pointing (or that would
 * point) at its entry; returns the entry or 0. */
static uint64_t hash_find(struct lh_ctx *c, uint64_t key, uint64_t **link)
{
	uint64_t *l = hash_slot(c, key);
	for (;;) {
		uint64_t at = *l;
		if (at == 0 || HE(c, at)->key == key) {
			*link = l;
			return at;
		}
		l = &HE(c, at)->next;
	}
}

static uint64_t hash_new_entry(struct lh_ctx *c, uint64_t key, uint64_t next, uint64_t len,
		uint8_t fill)
{
	uint64_t at = tx_alloc(sizeof(struct hash_entry) + len, T_HASH_ENTRY);
	struct hash_entry *e = HE(c, at);
	e->key = key;
	e->next = next;
	e->len = len;
	memset(e->bytes, fill, len);
	return at;
}

/* Sets `key`: a value of the same length is overwritten in place; otherwise the entry
 * is reallocated. */
static void hash_insert(struct lh_ctx *c, uint64_t key, uint64_t len, uint8_t fill)
{
	uint64_t *link;
	uint64_t at = hash_find(c, key, &link);
	if (at) {
		struct hash_entry *e = HE(c, at);
		if (e->len == len) {
			pmemobj_tx_add_range_direct(e->bytes, len);
			memset(e->bytes, fill, len);
		} else {
			uint64_t fresh = hash_new_entry(c, key, e->next, len, fill);
			set_u64(link, fresh);
			tx_free(c, at);
		}
		return;
	}
	uint64_t *slot = hash_slot(c, key);
	uint64_t fresh = hash_new_entry(c, key, *slot, len, fill);
	set_u64(slot, fresh);
	uint64_t *count = hash_count_slot(c, key);
	set_u64(count, *count + 1);
}

/* --- Operations -------------------------------------------------------------------------- */

static int store_contains(struct lh_ctx *c, uint64_t key)
{
	uint64_t *link;
	switch (c->kind) {
	case LH_RBTREE:
		return rb_find(c, key) != 0;
	case LH_BPTREE:
		return bp_contains(c, key, NULL);
	default:
		return hash_find(c, key, &link) != 0;
	}
}

static void store_insert(struct lh_ctx *c, uint64_t key, uint64_t len, uint8_t fill)
{
	switch (c->kind) {
	case LH_RBTREE:
		rb_insert(c, key, len, fill);
		break;
	case LH_BPTREE:
		bp_insert(c, key, len, fill);
		break;
	default:
		hash_insert(c, key, len, fill);
		break;
	}
}

/* Removes `key`, which is present. */
static void store_remove(struct lh_ctx *c, uint64_t key)
{
	uint64_t *link, at;
	switch (c->kind) {
	case LH_RBTREE:
		rb_remove_node(c, rb_find(c, key));
		break;
	case LH_BPTREE:
		bp_remove(c, key);
		break;
	default:
		at = hash_find(c, key, &link);
		set_u64(link, HE(c, at)->next);
		tx_free(c, at);
		{
			uint64_t *count = hash_count_slot(c, key);
			set_u64(count, *count - 1);
		}
		break;
	}
}

/* The body of one measured operation's transaction (Prepared::operate). */
static void apply(struct lh_ctx *c, const struct lh_op *op)
{
	if (c->kind == LH_SPS) {
		sps_swap(c, op->key, op->other);
	} else if (c->mode == LH_INSERT) {
		store_insert(c, op->key, op->len, op->fill);
	} else if (store_contains(c, op->key)) {
		store_remove(c, op->key);
	} else {
		store_insert(c, op->key, op->len, op->fill);
	}
}

/* One preload operation: SPS sets element `key` to `key`; the others insert. */
static void apply_preload(struct lh_ctx *c, const struct lh_op *op)
{
	if (c->kind == LH_SPS)
		set_u64(&array_data(c)[op->key], op->key);
	else
		store_insert(c, op->key, op->len, op->fill);
}

/* The locks an operation on `op` takes, in order (at most two). */
static size_t locks_of(struct lh_ctx *c, const struct lh_op *op, pthread_mutex_t *out[2])
{
	if (c->kind == LH_RBTREE || c->kind == LH_BPTREE) {
		out[0] = &c->tree_lock;
		return 1;
	}
	if (c->kind == LH_HASH) {
		uint64_t s = bucket_of(op->key, HH(c)->buckets) % c->nstripes;
		out[0] = &c->stripes[s].m;
		return 1;
	}
	uint64_t a = op->key % c->nstripes, b = op->other % c->nstripes;
	if (a > b) {
		uint64_t t = a;
		a = b;
		b = t;
	}
	out[0] = &c->stripes[a].m;
	if (a == b)
		return 1;
	out[1] = &c->stripes[b].m;
	return 2;
}

/* Creates the empty structure of `c->kind` and points the root at it, in one
 * transaction. 0, or an errno value. */
static int create_structure(struct lh_ctx *c, struct lh_root *root, uint64_t elements,
		uint64_t buckets)
{
	volatile int err = 0;
	TX_BEGIN(c->pop) {
		uint64_t header = 0;
		if (c->kind == LH_SPS) {
			header = tx_alloc(sizeof(struct array_header), T_HEADER);
			struct array_header *h = P(c, header);
			h->len = elements;
			h->element_size = 8;
			h->data = tx_zalloc(elements * 8, T_ARRAY);
		} else if (c->kind == LH_RBTREE) {
			header = tx_alloc(sizeof(struct rb_header), T_HEADER);
			struct rb_header *h = P(c, header);
			h->nil = tx_zalloc(sizeof(struct rb_node), T_RB_NODE);
			h->root = h->nil;
			h->count = 0;
		} else if (c->kind == LH_BPTREE) {
			header = tx_alloc(sizeof(struct bp_header), T_HEADER);
			struct bp_header *h = P(c, header);
			h->root = tx_zalloc(sizeof(struct bp_node), T_BP_NODE);
			BPN(c, h->root)->leaf = 1;
			h->count = 0;
		} else {
			header = tx_alloc(sizeof(struct hash_header), T_HEADER);
			struct hash_header *h = P(c, header);
			h->buckets = buckets ? buckets : 1;
			h->stripes = c->nstripes;
			h->table = tx_zalloc(h->buckets * 8, T_TABLE);
			h->counts = tx_zalloc(c->nstripes * COUNT_SPACING * 8, T_TABLE);
		}
		pmemobj_tx_add_range_direct(root, sizeof(*root));
		root->kind = (uint64_t)c->kind;
		root->header = header;
	} TX_ONABORT {
		err = errno ? errno : EINVAL;
	} TX_END
	return err;
}

/* One transaction of `n` operations: the preload's (`preload`: apply_preload) or one
 * measured operation's (apply). 0, or an errno value. */
static int ops_tx(struct lh_ctx *c, const struct lh_op *ops, size_t n, int preload)
{
	volatile int err = 0;
	TX_BEGIN(c->pop) {
		for (size_t i = 0; i < n; i++) {
			if (preload)
				apply_preload(c, &ops[i]);
			else
				apply(c, &ops[i]);
		}
	} TX_ONABORT {
		err = errno ? errno : EINVAL;
	} TX_END
	return err;
}

/* --- Exported functions ------------------------------------------------------------------ */

/* The size of `struct lh_op` (checked against Rust's `Op`). */
size_t lh_op_size(void)
{
	return sizeof(struct lh_op);
}

/* The last libpmemobj error message of this thread. */
const char *lh_errormsg(void)
{
	return pmemobj_errormsg();
}

/* Creates a pool file of `size` bytes at `path` holding an empty structure of `kind`
 * whose measured phase runs in `mode` (enum lh_mode). `elements`: the SPS array's
 * length; `buckets`: the hash table's bucket count. NULL on failure (see
 * lh_errormsg). */
struct lh_ctx *lh_create(const char *path, uint64_t size, int kind, int mode,
		uint64_t elements, uint64_t buckets)
{
	if (mode < LH_INSERT || mode > LH_LOOKUP_ONLY) {
		errno = EINVAL;
		return NULL;
	}
	struct lh_ctx *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->kind = kind;
	c->mode = mode;
	c->pop = pmemobj_create(path, "logheap-bench", size, 0600);
	if (!c->pop) {
		free(c);
		return NULL;
	}
	c->base = (char *)c->pop;
	PMEMoid root_oid = pmemobj_root(c->pop, sizeof(struct lh_root));
	if (OID_IS_NULL(root_oid))
		goto fail;
	c->uuid_lo = root_oid.pool_uuid_lo;
	pthread_mutex_init(&c->tree_lock, NULL);
	pthread_rwlock_init(&c->tree_rwlock, NULL);
	if (kind == LH_HASH || kind == LH_SPS) {
		uint64_t universe = kind == LH_HASH ? buckets : elements;
		c->nstripes = STRIPES;
		while (c->nstripes > 1 && c->nstripes / 2 >= universe)
			c->nstripes /= 2;
		c->stripes = calloc(c->nstripes, sizeof(struct stripe_lock));
		if (!c->stripes)
			goto fail;
		for (uint64_t i = 0; i < c->nstripes; i++)
			pthread_mutex_init(&c->stripes[i].m, NULL);
	}
	struct lh_root *root = pmemobj_direct(root_oid);
	if (create_structure(c, root, elements, buckets))
		goto fail;
	c->header = root->header;
	return c;
fail:
	pmemobj_close(c->pop);
	free(c->stripes);
	free(c);
	return NULL;
}

/* Closes the pool (the caller removes the file). */
void lh_close(struct lh_ctx *c)
{
	pmemobj_close(c->pop);
	pthread_mutex_destroy(&c->tree_lock);
	pthread_rwlock_destroy(&c->tree_rwlock);
	for (uint64_t i = 0; i < c->nstripes; i++)
		pthread_mutex_destroy(&c->stripes[i].m);
	free(c->stripes);
	free(c);
}

/* Preloads: `n` operations in transactions of `per_tx` operations (logheap's harness
 * passes its own batch size), on one thread, without locks. 0, or an errno value (see
 * lh_errormsg). */
int lh_preload(struct lh_ctx *c, const struct lh_op *ops, size_t n, size_t per_tx)
{
	if (per_tx == 0)
		return EINVAL;
	for (size_t done = 0; done < n; done += per_tx) {
		size_t batch = n - done < per_tx ? n - done : per_tx;
		int err = ops_tx(c, &ops[done], batch, 1);
		if (err)
			return err;
	}
	return 0;
}

/* The locks one measured operation holds. */
struct held_locks {
	pthread_mutex_t *mutexes[2];
	size_t nmutexes;
	pthread_rwlock_t *rwlock;
};

/* Takes the locks of `op` (`lookup`: it is a read-heavy workload's look-up): none when
 * only look-ups run; the tree's reader-writer lock in the read-mostly mode (shared for
 * a look-up); else locks_of's. */
static void take_locks(struct lh_ctx *c, const struct lh_op *op, int lookup, struct held_locks *h)
{
	h->nmutexes = 0;
	h->rwlock = NULL;
	if (c->mode == LH_LOOKUP_ONLY)
		return;
	if (c->mode == LH_READ_MOSTLY && (c->kind == LH_RBTREE || c->kind == LH_BPTREE)) {
		h->rwlock = &c->tree_rwlock;
		if (lookup)
			pthread_rwlock_rdlock(h->rwlock);
		else
			pthread_rwlock_wrlock(h->rwlock);
		return;
	}
	h->nmutexes = locks_of(c, op, h->mutexes);
	for (size_t l = 0; l < h->nmutexes; l++)
		pthread_mutex_lock(h->mutexes[l]);
}

static void drop_locks(struct held_locks *h)
{
	if (h->rwlock)
		pthread_rwlock_unlock(h->rwlock);
	for (size_t l = h->nmutexes; l > 0; l--)
		pthread_mutex_unlock(h->mutexes[l - 1]);
}

/* Finds `key` (a tree or the hash table): 1 with the value's bytes and length, or 0. */
static int find_value(struct lh_ctx *c, uint64_t key, const uint8_t **bytes, uint64_t *len)
{
	uint64_t value, *link;
	switch (c->kind) {
	case LH_RBTREE:
		value = rb_find(c, key);
		if (!value)
			return 0;
		value = RB(c, value)->value;
		*len = ((struct value_obj *)P(c, value))->len;
		*bytes = ((struct value_obj *)P(c, value))->bytes;
		return 1;
	case LH_BPTREE:
		if (!bp_contains(c, key, &value))
			return 0;
		*len = ((struct value_obj *)P(c, value))->len;
		*bytes = ((struct value_obj *)P(c, value))->bytes;
		return 1;
	default:
		value = hash_find(c, key, &link);
		if (!value)
			return 0;
		*len = HE(c, value)->len;
		*bytes = HE(c, value)->bytes;
		return 1;
	}
}

/* A buffer the look-ups copy values into, grown as needed. */
struct value_buf {
	uint8_t *bytes;
	uint64_t cap;
};

/*
 * One look-up, outside any transaction: finds `key` through direct pointers and copies
 * its value into `buf` (as logheap's `get` copies it out), counting it in `t`. 0, or
 * ENOMEM. Not inlined, so that the copy is not optimised away with the buffer.
 */
static __attribute__((noinline)) int lookup_copy(struct lh_ctx *c, uint64_t key,
		struct value_buf *buf, struct lh_lookups *t)
{
	const uint8_t *bytes;
	uint64_t len = 0;
	t->lookups++;
	if (!find_value(c, key, &bytes, &len))
		return 0;
	if (len > buf->cap) {
		uint8_t *grown = realloc(buf->bytes, len);
		if (!grown)
			return ENOMEM;
		buf->bytes = grown;
		buf->cap = len;
	}
	t->found++;
	if (len) {
		memcpy(buf->bytes, bytes, len);
		t->fill_sum += buf->bytes[0];
	}
	return 0;
}

/* Whether `op` is a look-up (in a read-heavy workload's measured phase). */
static int is_lookup(const struct lh_ctx *c, const struct lh_op *op)
{
	return c->mode == LH_LOOKUP_ONLY || (c->mode == LH_READ_MOSTLY && op->other != LH_OP_UPDATE);
}

/* Runs `n` operations under the structure's locks (any number of threads at once, each
 * with its own operations): one transaction each, or, for the read-heavy workloads'
 * look-ups, a look-up outside any transaction (counted into `found` when it is not
 * NULL). Nothing aborts for a conflict under the locks, so the first abort is a
 * failure: 0, or the errno value of the first failure (see lh_errormsg). */
int lh_run(struct lh_ctx *c, const struct lh_op *ops, size_t n, struct lh_lookups *found)
{
	if (c->kind == LH_SPS && (c->mode == LH_READ_MOSTLY || c->mode == LH_LOOKUP_ONLY))
		return EINVAL;
	struct lh_lookups tally = {0, 0, 0};
	struct value_buf buf = {NULL, 0};
	int err = 0;
	for (size_t i = 0; i < n && !err; i++) {
		int lookup = is_lookup(c, &ops[i]);
		struct held_locks held;
		take_locks(c, &ops[i], lookup, &held);
		if (lookup)
			err = lookup_copy(c, ops[i].key, &buf, &tally);
		else
			err = ops_tx(c, &ops[i], 1, 0);
		drop_locks(&held);
	}
	free(buf.bytes);
	if (found) {
		found->lookups += tally.lookups;
		found->found += tally.found;
		found->fill_sum += tally.fill_sum;
	}
	return err;
}

/* The entry count the structure keeps (SPS: the array's length). */
uint64_t lh_count(struct lh_ctx *c)
{
	switch (c->kind) {
	case LH_SPS:
		return ((struct array_header *)P(c, c->header))->len;
	case LH_RBTREE:
		return RBH(c)->count;
	case LH_BPTREE:
		return BPH(c)->count;
	default: {
		uint64_t sum = 0;
		uint64_t *counts = P(c, HH(c)->counts);
		for (uint64_t s = 0; s < HH(c)->stripes; s++)
			sum += counts[s * COUNT_SPACING];
		return sum;
	}
	}
}

/* Whether `key` is present (SPS: whether `key` is an index); its value's length and
 * byte. -1 if the value's bytes are not all the same. */
int lh_lookup(struct lh_ctx *c, uint64_t key, uint64_t *len, uint8_t *fill)
{
	const uint8_t *bytes = NULL;
	*len = 0;
	*fill = 0;
	if (c->kind == LH_SPS) {
		struct array_header *h = P(c, c->header);
		if (key >= h->len)
			return 0;
		*len = array_data(c)[key];
		return 1;
	}
	if (!find_value(c, key, &bytes, len))
		return 0;
	if (*len == 0)
		return 1;
	*fill = bytes[0];
	for (uint64_t i = 1; i < *len; i++)
		if (bytes[i] != bytes[0])
			return -1;
	return 1;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return (x > y) - (x < y);
}

/* Verification walks: each returns the number of entries found, or -1 with `msg`. */

static int64_t verify_sps(struct lh_ctx *c, char *msg, size_t cap)
{
	struct array_header *h = P(c, c->header);
	uint64_t *a = array_data(c);
	uint8_t *seen = calloc(h->len ? h->len : 1, 1);
	if (!seen) {
		snprintf(msg, cap, "out of memory");
		return -1;
	}
	for (uint64_t i = 0; i < h->len; i++) {
		if (a[i] >= h->len || seen[a[i]]) {
			snprintf(msg, cap, "element %llu holds %llu: not a permutation of 0..%llu",
					(unsigned long long)i, (unsigned long long)a[i],
					(unsigned long long)h->len);
			free(seen);
			return -1;
		}
		seen[a[i]] = 1;
	}
	free(seen);
	return (int64_t)h->len;
}

/* A node to visit in a tree walk: its key bounds and its depth (black nodes above it in
 * the red-black tree, levels in the B+ tree). */
struct tree_frame {
	uint64_t node, lo, hi, depth;
	int has_lo, has_hi;
};

/* The walk's stack of frames to visit. */
struct frame_stack {
	struct tree_frame *frames;
	size_t top, cap;
};

/* A stack holding `first`. 0, or -1 (with `msg`) when out of memory. */
static int stack_init(struct frame_stack *s, struct tree_frame first, char *msg, size_t cap)
{
	s->cap = 256;
	s->top = 0;
	s->frames = malloc(s->cap * sizeof(*s->frames));
	if (!s->frames) {
		snprintf(msg, cap, "out of memory");
		return -1;
	}
	s->frames[s->top++] = first;
	return 0;
}

/* Pushes `f`, growing the stack. 0, or -1 (with `msg`) when out of memory. */
static int stack_push(struct frame_stack *s, struct tree_frame f, char *msg, size_t cap)
{
	if (s->top == s->cap) {
		struct tree_frame *grown = realloc(s->frames, 2 * s->cap * sizeof(*s->frames));
		if (!grown) {
			snprintf(msg, cap, "out of memory");
			return -1;
		}
		s->frames = grown;
		s->cap *= 2;
	}
	s->frames[s->top++] = f;
	return 0;
}

static int64_t verify_rb(struct lh_ctx *c, char *msg, size_t cap)
{
	uint64_t nil = RBH(c)->nil, root = RBH(c)->root;
	if (rb_is_red(c, root)) {
		snprintf(msg, cap, "the root is red");
		return -1;
	}
	struct frame_stack stack;
	if (stack_init(&stack, (struct tree_frame){root, 0, 0, 0, 0, 0}, msg, cap))
		return -1;
	int64_t nodes = 0, black_height = -1;
	while (stack.top > 0) {
		struct tree_frame f = stack.frames[--stack.top];
		if (f.node == nil) {
			if (black_height < 0) {
				black_height = (int64_t)f.depth;
			} else if ((uint64_t)black_height != f.depth) {
				snprintf(msg, cap, "black heights differ");
				goto bad;
			}
			continue;
		}
		nodes++;
		uint64_t k = RB(c, f.node)->key;
		if ((f.has_lo && k <= f.lo) || (f.has_hi && k >= f.hi)) {
			snprintf(msg, cap, "key %llu is out of order", (unsigned long long)k);
			goto bad;
		}
		int red = rb_is_red(c, f.node);
		for (int d = LEFT; d <= RIGHT; d++) {
			uint64_t ch = RB(c, f.node)->child[d];
			if (ch != nil) {
				if (RB(c, ch)->parent != f.node) {
					snprintf(msg, cap, "a child of %llu has a wrong parent",
							(unsigned long long)k);
					goto bad;
				}
				if (red && rb_is_red(c, ch)) {
					snprintf(msg, cap, "red node %llu has a red child",
							(unsigned long long)k);
					goto bad;
				}
			}
			struct tree_frame g = {ch, f.lo, f.hi, f.depth + !red, f.has_lo, f.has_hi};
			if (d == LEFT) {
				g.hi = k;
				g.has_hi = 1;
			} else {
				g.lo = k;
				g.has_lo = 1;
			}
			if (stack_push(&stack, g, msg, cap))
				goto bad;
		}
	}
	free(stack.frames);
	if ((uint64_t)nodes != RBH(c)->count) {
		snprintf(msg, cap, "%lld nodes but a count of %llu", (long long)nodes,
				(unsigned long long)RBH(c)->count);
		return -1;
	}
	return nodes;
bad:
	free(stack.frames);
	return -1;
}

static int64_t verify_bp(struct lh_ctx *c, char *msg, size_t cap)
{
	uint64_t root = BPH(c)->root;
	struct frame_stack stack;
	if (stack_init(&stack, (struct tree_frame){root, 0, 0, 0, 0, 0}, msg, cap))
		return -1;
	int64_t entries = 0, leaf_depth = -1;
	while (stack.top > 0) {
		struct tree_frame f = stack.frames[--stack.top];
		struct bp_node *n = BPN(c, f.node);
		size_t cnt = (size_t)n->count;
		if (cnt > BP_MAX || (f.node != root && cnt < BP_MIN)) {
			snprintf(msg, cap, "node %#llx holds %zu keys", (unsigned long long)f.node, cnt);
			goto bad;
		}
		for (size_t i = 0; i < cnt; i++) {
			uint64_t k = n->keys[i];
			if ((i > 0 && n->keys[i - 1] >= k) || (f.has_lo && k < f.lo) ||
					(f.has_hi && k >= f.hi)) {
				snprintf(msg, cap, "keys of node %#llx are out of order or bounds",
						(unsigned long long)f.node);
				goto bad;
			}
		}
		if (n->leaf) {
			if (leaf_depth < 0) {
				leaf_depth = (int64_t)f.depth;
			} else if ((uint64_t)leaf_depth != f.depth) {
				snprintf(msg, cap, "leaves at different depths");
				goto bad;
			}
			entries += (int64_t)cnt;
			continue;
		}
		for (size_t i = 0; i <= cnt; i++) {
			struct tree_frame g = {n->ptrs[i], f.lo, f.hi, f.depth + 1, f.has_lo, f.has_hi};
			if (i > 0) {
				g.lo = n->keys[i - 1];
				g.has_lo = 1;
			}
			if (i < cnt) {
				g.hi = n->keys[i];
				g.has_hi = 1;
			}
			if (stack_push(&stack, g, msg, cap))
				goto bad;
		}
	}
	free(stack.frames);
	/* The leaf chain holds every entry in ascending order. */
	uint64_t at = root;
	while (!BPN(c, at)->leaf)
		at = BPN(c, at)->ptrs[0];
	int64_t chained = 0;
	int has_prev = 0;
	uint64_t prev = 0;
	for (; at != 0; at = BPN(c, at)->next) {
		struct bp_node *n = BPN(c, at);
		for (size_t i = 0; i < bp_n(n); i++) {
			if (has_prev && n->keys[i] <= prev) {
				snprintf(msg, cap, "the leaf chain is out of order");
				return -1;
			}
			prev = n->keys[i];
			has_prev = 1;
			chained++;
		}
		if (chained > entries) {
			/* More than the tree holds: a cycle, or leaves outside the tree. */
			snprintf(msg, cap, "the leaf chain holds more than the tree's %lld entries",
					(long long)entries);
			return -1;
		}
	}
	if (chained != entries || (uint64_t)entries != BPH(c)->count) {
		snprintf(msg, cap, "%lld entries in the tree, %lld in the leaf chain, a count of %llu",
				(long long)entries, (long long)chained,
				(unsigned long long)BPH(c)->count);
		return -1;
	}
	return entries;
bad:
	free(stack.frames);
	return -1;
}

static int64_t verify_hash(struct lh_ctx *c, char *msg, size_t cap)
{
	struct hash_header *h = HH(c);
	uint64_t *table = P(c, h->table);
	size_t len = 0, room = 1024;
	uint64_t *keys = malloc(room * sizeof(uint64_t));
	if (!keys) {
		snprintf(msg, cap, "out of memory");
		return -1;
	}
	for (uint64_t b = 0; b < h->buckets; b++) {
		for (uint64_t at = table[b]; at != 0; at = HE(c, at)->next) {
			uint64_t k = HE(c, at)->key;
			if (bucket_of(k, h->buckets) != b) {
				snprintf(msg, cap, "key %llu is in bucket %llu, not its own",
						(unsigned long long)k, (unsigned long long)b);
				free(keys);
				return -1;
			}
			if (len == room) {
				room *= 2;
				uint64_t *k2 = realloc(keys, room * sizeof(uint64_t));
				if (!k2) {
					snprintf(msg, cap, "out of memory");
					free(keys);
					return -1;
				}
				keys = k2;
			}
			keys[len++] = k;
		}
	}
	qsort(keys, len, sizeof(uint64_t), cmp_u64);
	for (size_t i = 1; i < len; i++) {
		if (keys[i] == keys[i - 1]) {
			snprintf(msg, cap, "key %llu is in the table twice",
					(unsigned long long)keys[i]);
			free(keys);
			return -1;
		}
	}
	free(keys);
	if (len != lh_count(c)) {
		snprintf(msg, cap, "%zu entries but a count of %llu", len,
				(unsigned long long)lh_count(c));
		return -1;
	}
	return (int64_t)len;
}

/* Checks the structure's invariants (SPS: the array is a permutation of its indices;
 * trees: order, balance, links and count; hash table: every key in its own bucket,
 * once, and the count). Returns the number of entries, or -1 with what is wrong in
 * `msg`. Not concurrently with lh_run. */
int64_t lh_verify(struct lh_ctx *c, char *msg, size_t cap)
{
	switch (c->kind) {
	case LH_SPS:
		return verify_sps(c, msg, cap);
	case LH_RBTREE:
		return verify_rb(c, msg, cap);
	case LH_BPTREE:
		return verify_bp(c, msg, cap);
	default:
		return verify_hash(c, msg, cap);
	}
}

/* Persistent memory held by live objects: the usable sizes of every allocated object
 * (a heap walk; not concurrently with lh_run). */
uint64_t lh_pm_used(struct lh_ctx *c)
{
	uint64_t sum = 0;
	PMEMoid oid;
	POBJ_FOREACH(c->pop, oid)
	{
		sum += pmemobj_alloc_usable_size(oid);
	}
	return sum;
}

/* --- Random allocation and free (issue 11: PMDK's allocator against logheap's) ------- */

/* A pool whose root is an array of `nslots` persistent pointers. */
struct lh_alloc_pool {
	PMEMobjpool *pop;
	PMEMoid *slots;
	uint64_t nslots;
};

/* Creates a pool of `size` bytes at `path` with `nslots` null pointers in its root.
 * NULL on failure (see lh_errormsg). */
struct lh_alloc_pool *lh_alloc_create(const char *path, uint64_t size, uint64_t nslots)
{
	struct lh_alloc_pool *p = calloc(1, sizeof(*p));
	if (!p)
		return NULL;
	p->pop = pmemobj_create(path, "logheap-alloc", size, 0600);
	if (!p->pop) {
		free(p);
		return NULL;
	}
	PMEMoid root = pmemobj_root(p->pop, nslots * sizeof(PMEMoid));
	if (OID_IS_NULL(root)) {
		pmemobj_close(p->pop);
		free(p);
		return NULL;
	}
	p->slots = pmemobj_direct(root);
	p->nslots = nslots;
	return p;
}

/* Closes the pool (the caller removes the file). */
void lh_alloc_close(struct lh_alloc_pool *p)
{
	pmemobj_close(p->pop);
	free(p);
}

/* Runs `n` operations; operation `k` is `slot | size << 32`: pmemobj_alloc of `size`
 * bytes into the slot when it is null, else pmemobj_free of it (the reference-passing
 * calls, as logheap's allocate_into / deallocate). Threads may run at once on disjoint
 * slots. 0, or the errno value of the first failure (see lh_errormsg). */
int lh_alloc_run(struct lh_alloc_pool *p, const uint64_t *ops, size_t n)
{
	for (size_t k = 0; k < n; k++) {
		uint64_t slot = ops[k] & 0xffffffffu;
		size_t size = (size_t)(ops[k] >> 32);
		if (slot >= p->nslots)
			return EINVAL;
		if (OID_IS_NULL(p->slots[slot])) {
			if (pmemobj_alloc(p->pop, &p->slots[slot], size, 0, NULL, NULL))
				return errno ? errno : ENOMEM;
		} else {
			pmemobj_free(&p->slots[slot]);
		}
	}
	return 0;
}
