/*
 * byte_relay.c - the least work an intermediary process can do: a TCP byte relay.
 *
 *   byte_relay LISTEN_PORT TARGET_PORT [SPIN_US]
 *
 * Listens on 127.0.0.1:LISTEN_PORT (0: an ephemeral port), prints "listening PORT" once it
 * does, and for each accepted connection connects to 127.0.0.1:TARGET_PORT and copies bytes
 * both ways unchanged: epoll, non-blocking sockets, TCP_NODELAY on both, one read and one
 * write onward per readable socket, no parsing. An AMQP connection passes through unchanged,
 * so the load client can run through one relay, or relays in series, as through a router:
 * the floor of what any router adds (issue 18, docs/performance.md "the floor").
 *
 * SPIN_US > 0: after an iteration that moved bytes, poll (epoll_wait with timeout 0) for up
 * to that many microseconds before sleeping in epoll_wait, as a busy-polling router does.
 * When the onward socket is full, the rest waits in the pair's buffer and the source is not
 * read until it drained (bounded memory). Either side closing closes both.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BUF 65536
#define EVENTS 64

typedef struct side {
  int fd;
  struct side *peer;
  char buf[BUF]; /* bytes read from this side, not yet written to the peer */
  size_t off, len;
} side;

static int ep;
static side listener; /* the listening socket's tag in the epoll set */

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* A side reads while its own buffer is empty and waits to write while its peer's is not. */
static void rewatch(side *s) {
  struct epoll_event ev = {.events = 0, .data.ptr = s};
  if (!s->len) ev.events |= EPOLLIN;
  if (s->peer->len) ev.events |= EPOLLOUT;
  epoll_ctl(ep, EPOLL_CTL_MOD, s->fd, &ev);
}

/* Write what `s` holds to its peer: 1 when all of it left, 0 when some waits, -1 on error. */
static int drain(side *s) {
  while (s->off < s->len) {
    ssize_t n = send(s->peer->fd, s->buf + s->off, s->len - s->off, MSG_NOSIGNAL);
    if (n < 0) return (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -1;
    s->off += (size_t)n;
  }
  s->off = s->len = 0;
  return 1;
}

/* The events of one side: bytes read from it go to its peer; its writability drains the peer's
 * held bytes. 1: bytes moved, 0: nothing, -1: the pair is to be closed. */
static int pump(side *s, uint32_t events) {
  int moved = 0;
  if (events & (EPOLLERR | EPOLLHUP) && !(events & EPOLLIN)) return -1;
  if ((events & EPOLLOUT) && s->peer->len) {
    int d = drain(s->peer);
    if (d < 0) return -1;
    if (d) { rewatch(s); rewatch(s->peer); }
    moved = 1;
  }
  if ((events & EPOLLIN) && !s->len) {
    ssize_t n = recv(s->fd, s->buf, BUF, 0);
    if (n == 0) return -1;
    if (n < 0) return (errno == EAGAIN || errno == EWOULDBLOCK) ? moved : -1;
    s->len = (size_t)n;
    int d = drain(s);
    if (d < 0) return -1;
    if (!d) { rewatch(s); rewatch(s->peer); } /* hold: read s again once its peer took it */
    moved = 1;
  }
  return moved;
}

static void close_pair(side *s, struct epoll_event *rest, int nrest) {
  side *a = s < s->peer ? s : s->peer; /* both halves are one allocation */
  for (int i = 0; i < nrest; i++) /* events of this batch still to come for the pair */
    if (rest[i].data.ptr == a || rest[i].data.ptr == a + 1) rest[i].data.ptr = NULL;
  close(a[0].fd); /* close removes them from the epoll set */
  close(a[1].fd);
  free(a);
}

static int add(side *s) {
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = s};
  int one = 1;
  setsockopt(s->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return epoll_ctl(ep, EPOLL_CTL_ADD, s->fd, &ev);
}

static void accept_one(int lfd, const struct sockaddr_in *target) {
  int c = accept4(lfd, NULL, NULL, SOCK_NONBLOCK);
  if (c < 0) return;
  int t = socket(AF_INET, SOCK_STREAM, 0); /* a blocking connect: loopback answers at once */
  if (t < 0 || connect(t, (const struct sockaddr *)target, sizeof *target) < 0 ||
      fcntl(t, F_SETFL, O_NONBLOCK) < 0) {
    close(c);
    if (t >= 0) close(t);
    return;
  }
  side *pair = calloc(2, sizeof(side));
  if (!pair) { close(c); close(t); return; }
  pair[0].fd = c; pair[1].fd = t;
  pair[0].peer = &pair[1]; pair[1].peer = &pair[0];
  if (add(&pair[0]) < 0 || add(&pair[1]) < 0) { close(c); close(t); free(pair); }
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: byte_relay LISTEN_PORT TARGET_PORT [SPIN_US]\n");
    return 2;
  }
  int64_t spin_ns = argc > 3 ? atol(argv[3]) * 1000LL : 0;
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  struct sockaddr_in target = addr;
  addr.sin_port = htons((uint16_t)atoi(argv[1]));
  target.sin_port = htons((uint16_t)atoi(argv[2]));
  int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), one = 1;
  setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  socklen_t alen = sizeof addr;
  if (lfd < 0 || bind(lfd, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(lfd, 128) < 0 ||
      getsockname(lfd, (struct sockaddr *)&addr, &alen) < 0) {
    perror("byte_relay: listen");
    return 1;
  }
  ep = epoll_create1(0);
  struct epoll_event lev = {.events = EPOLLIN, .data.ptr = &listener};
  epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &lev);
  printf("listening %d\n", ntohs(addr.sin_port));
  fflush(stdout);
  struct epoll_event evs[EVENTS];
  int64_t spin_until = 0;
  for (;;) {
    int timeout = spin_ns && now_ns() < spin_until ? 0 : -1;
    int n = epoll_wait(ep, evs, EVENTS, timeout);
    if (n < 0 && errno != EINTR) { perror("byte_relay: epoll_wait"); return 1; }
    int moved = 0;
    for (int i = 0; i < n; i++) {
      side *s = evs[i].data.ptr;
      if (s == &listener) { accept_one(lfd, &target); continue; }
      if (s == NULL) continue; /* its pair was closed earlier in this batch */
      int r = pump(s, evs[i].events);
      if (r < 0) close_pair(s, evs + i + 1, n - i - 1);
      moved |= r > 0;
    }
    if (moved && spin_ns) spin_until = now_ns() + spin_ns;
  }
}
