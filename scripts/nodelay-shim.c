/*
 * An LD_PRELOAD library that sets TCP_NODELAY on every TCP socket a process connects
 * or accepts, for `logheap kv-bench --peer`: openraft's RocksDB example sends its Raft
 * RPCs over websockets (toy-rpc) with Nagle's algorithm on, so each replication round
 * waits for delayed acknowledgements (about 176 ms a write on loopback here). Written
 * by hand because the example's sockets are made inside toy-rpc, out of reach of a
 * setting, and no packaged library does this.
 *
 *   gcc -O2 -shared -fPIC -o libnodelay.so scripts/nodelay-shim.c -ldl
 *   LD_PRELOAD=$PWD/libnodelay.so logheap kv-bench --peer PATH/raft-key-value-rocks
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

/* A failure (a socket that is not TCP) changes nothing and is ignored. */
static void nodelay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int connect(int fd, const struct sockaddr *addr, socklen_t len) {
    static int (*real)(int, const struct sockaddr *, socklen_t);
    if (!real) real = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "connect");
    if (addr && (addr->sa_family == AF_INET || addr->sa_family == AF_INET6)) nodelay(fd);
    return real(fd, addr, len);
}

int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags) {
    static int (*real)(int, struct sockaddr *, socklen_t *, int);
    if (!real) real = (int (*)(int, struct sockaddr *, socklen_t *, int))dlsym(RTLD_NEXT, "accept4");
    int c = real(fd, addr, len, flags);
    if (c >= 0) nodelay(c);
    return c;
}

int accept(int fd, struct sockaddr *addr, socklen_t *len) {
    return accept4(fd, addr, len, 0);
}
