/* A persistent bank and a persistent queue in plain C with GNU TM transactions
 * (gcc -fgnu-tm), run by liblogheap_itm: every __transaction_atomic is a logheap
 * transaction on the TM pool, and the pool holds plain pointers (it is mapped at the
 * same address at every open).
 *
 * Usage: bank POOL ENGINE run   -- creates or opens POOL; transfers between accounts
 *                                  on two threads with audits; a queue of nodes
 *                                  allocated and freed in transactions; a cancelled
 *                                  transaction; a serial irrevocable one; closes,
 *                                  reopens and checks
 *        bank POOL ENGINE check -- opens POOL (another process) and checks it
 *        bank POOL ENGINE spin  -- transfers on two threads until killed, printing
 *                                  the count of transfers each commit made durable
 *        bank POOL ENGINE audit -- checks the total and prints the count of transfers
 * Prints "ok" and exits 0, or names the first failure and exits 1. */

#include <logheap_tm.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ACCOUNTS 64
#define START 1000
#define TRANSFERS 4000
#define NODES 100
#define DEQUEUED 30

struct node {
    uint64_t value;
    struct node *next;
};

struct bank {
    int64_t *accounts; /* ACCOUNTS balances, in the pool */
    struct node *head, *tail;
    uint64_t queued;
    uint64_t runs; /* transactions of the "run" step, committed */
    uint64_t transfers; /* transfers of the "spin" step, committed */
};

static struct bank *bank;

static void fail(const char *what) {
    fprintf(stderr, "FAIL: %s (%s)\n", what, lh_tm_errormsg());
    exit(1);
}

static void setup(void) {
    size_t size;
    bank = lh_tm_root(&size);
    if (bank == NULL || size < sizeof *bank) fail("root");
    __transaction_atomic {
        if (bank->accounts == NULL) {
            int64_t *a = lh_tm_alloc(ACCOUNTS * sizeof(int64_t));
            for (int i = 0; i < ACCOUNTS; i++) a[i] = START;
            bank->accounts = a;
        }
    }
}

static int64_t total(void) {
    int64_t sum = 0;
    __transaction_atomic {
        sum = 0;
        for (int i = 0; i < ACCOUNTS; i++) sum += bank->accounts[i];
    }
    return sum;
}

static unsigned next_random(unsigned *seed) {
    *seed = *seed * 1103515245u + 12345u;
    return *seed >> 8;
}

static void *transfers(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    for (int t = 0; t < TRANSFERS; t++) {
        int from = next_random(&seed) % ACCOUNTS, to = next_random(&seed) % ACCOUNTS;
        int64_t amount = next_random(&seed) % 50;
        __transaction_atomic {
            bank->accounts[from] -= amount;
            bank->accounts[to] += amount;
        }
        if (t % 500 == 0 && total() != ACCOUNTS * START) fail("an audit saw money appear or vanish");
    }
    return NULL;
}

static void enqueue(uint64_t value) {
    __transaction_atomic {
        struct node *n = lh_tm_alloc(sizeof *n);
        if (n == NULL) __transaction_cancel;
        n->value = value;
        n->next = NULL;
        if (bank->tail) bank->tail->next = n;
        else bank->head = n;
        bank->tail = n;
        bank->queued++;
    }
}

static uint64_t dequeue(void) {
    uint64_t value = 0;
    __transaction_atomic {
        struct node *n = bank->head;
        if (n) {
            value = n->value;
            bank->head = n->next;
            if (!bank->head) bank->tail = NULL;
            bank->queued--;
            lh_tm_free(n);
        }
    }
    return value;
}

/* Walks the queue: its length, and whether it holds DEQUEUED+1 .. NODES in order. */
static void check_queue(void) {
    uint64_t expect = DEQUEUED + 1, length = 0;
    for (struct node *n = bank->head; n; n = n->next, length++, expect++)
        if (n->value != expect) fail("the queue's order");
    if (length != NODES - DEQUEUED || bank->queued != length) fail("the queue's length");
}

static void check(void) {
    if (total() != ACCOUNTS * START) fail("the total after reopening");
    check_queue();
    if (bank->runs != 1) fail("the run count");
}

/* Not transaction_safe: calling it makes the transaction serial irrevocable. */
__attribute__((noinline)) static void note(const char *what, uint64_t *counter) {
    char line[64];
    snprintf(line, sizeof line, "%s", what);
    if (strlen(line) > 0) (*counter)++;
}

/* Transfers until killed; after each commit, prints the transfer count it reached
 * (acknowledged: durable once printed). */
static void *spin(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    for (;;) {
        int from = next_random(&seed) % ACCOUNTS, to = next_random(&seed) % ACCOUNTS;
        int64_t amount = next_random(&seed) % 50;
        uint64_t count;
        __transaction_atomic {
            bank->accounts[from] -= amount;
            bank->accounts[to] += amount;
            count = ++bank->transfers;
        }
        char line[32];
        int n = snprintf(line, sizeof line, "%llu\n", (unsigned long long)count);
        if (write(1, line, (size_t)n) != n) exit(1);
    }
    return NULL;
}

/* Where the cancelled transaction writes (set outside it, so the address escapes). */
static int *escape;
/* Calls `fp` in a transaction: GCC, not knowing `fp`, asks the runtime for its
 * transactional clone (_ITM_getTMCloneOrIrrevocable), which finds none and makes the
 * transaction restart serial irrevocable (_ITM_changeTransactionMode). */
__attribute__((noinline)) static void count_run_and_call(void (*fp)(const char *, uint64_t *),
                                                         uint64_t *notes) {
    __transaction_relaxed {
        bank->runs++;
        fp("irrevocable", notes);
    }
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: bank POOL ENGINE run|check|spin|audit\n");
        return 2;
    }
    if (lh_tm_open(argv[1], argv[2], 16 << 20) != 0) fail("open");
    setup();
    if (strcmp(argv[3], "spin") == 0) {
        pthread_t threads[2];
        for (int t = 0; t < 2; t++) pthread_create(&threads[t], NULL, spin, (void *)(uintptr_t)(t + 3));
        for (int t = 0; t < 2; t++) pthread_join(threads[t], NULL);
        return 1;
    }
    if (strcmp(argv[3], "audit") == 0) {
        if (total() != ACCOUNTS * START) fail("the total after a kill");
        printf("%llu\n", (unsigned long long)bank->transfers);
        if (lh_tm_close() != 0) fail("close");
        return 0;
    }
    if (strcmp(argv[3], "check") == 0) {
        check();
        if (lh_tm_close() != 0) fail("close");
        puts("ok");
        return 0;
    }

    pthread_t threads[2];
    for (int t = 0; t < 2; t++) pthread_create(&threads[t], NULL, transfers, (void *)(uintptr_t)(t + 7));
    for (int t = 0; t < 2; t++) pthread_join(threads[t], NULL);
    if (total() != ACCOUNTS * START) fail("the total after the transfers");

    for (uint64_t v = 1; v <= NODES; v++) enqueue(v);
    for (uint64_t v = 1; v <= DEQUEUED; v++)
        if (dequeue() != v) fail("dequeue order");
    check_queue();

    /* A cancelled transaction changes nothing, in the pool or in other memory (a
     * buffer whose address escapes, so GCC writes it through a barrier). */
    int *local = malloc(sizeof *local);
    *local = 1;
    escape = local;
    uint64_t before = bank->queued;
    __transaction_atomic {
        *escape = 2;
        struct node *n = lh_tm_alloc(sizeof *n);
        n->value = 999;
        bank->tail->next = n;
        bank->tail = n;
        bank->queued++;
        if (bank->queued > 0) __transaction_cancel;
    }
    if (*local != 1) fail("a cancelled transaction's write outside the pool stayed");
    free(local);
    if (bank->queued != before || bank->tail->next != NULL) fail("a cancelled transaction's pool writes stayed");

    /* A call GCC cannot see through goes serial irrevocable mid-way; the pool write
     * before it stays transactional (it is made again after the restart). */
    uint64_t notes = 0;
    count_run_and_call(note, &notes);
    if (notes != 1 || bank->runs != 1) fail("the irrevocable transaction ran once");
    /* A direct call of unsafe code: GCC compiles the block without barriers, and it
     * runs alone. */
    __transaction_relaxed {
        note("uninstrumented", &notes);
    }
    if (notes != 2) fail("the uninstrumented transaction ran once");

    if (lh_tm_close() != 0) fail("close");
    if (lh_tm_open(argv[1], argv[2], 0) != 0) fail("reopen");
    setup();
    check();
    if (lh_tm_close() != 0) fail("final close");
    puts("ok");
    return 0;
}
