/* The open-loop load generator's engine: bench/loadgen.py builds it, runs it for each step and reads
 * what it wrote; its docstring says what a step measures and why.
 *
 * Why C (what the asyncio engine it replaced cost, against this one): loadgen.py's docstring.
 *
 *   openloop PORT REQUEST_FILE OFFSETS_FILE DRAIN_S MAX_OPEN CONNECTIONS RECORDS_FILE LATE_FILE
 *
 * OFFSETS_FILE: the requests' due times in seconds from the start, sorted (float64, native order).
 * REQUEST_FILE: the bytes of one HTTP/1.1 request, sent as they are each time.
 * RECORDS_FILE gets five float64 per answer: due, sent, written (when the first write() returned),
 * answered (seconds from the start) and the HTTP status; LATE_FILE one float64 per request due: how
 * late the client itself sent it. Standard output: "errors overflow unanswered cpu_s".
 *
 * One thread, epoll. Each request goes out on an idle keep-alive connection (the last one to become
 * idle) or on a new one, up to MAX_OPEN in flight (beyond: counted as overflow, not queued). A
 * connection whose answer came before its request was all written (a server refusing a large body from
 * its headers) is idle again only once it is: an HTTP/1.1 client cannot start the next request before.
 * An answer is parsed just enough to find its status and length (Content-Length).
 *
 * Waits: epoll_pwait2 (nanosecond timeouts; the timer slack set to 1 ns), woken early by a running 90th
 * percentile of how late its timed-out waits came, then polling to the due time: a wake late by tens of
 * microseconds would send the requests due meanwhile together, in a burst a Poisson process does not
 * have. Where requests are due closer together than a wake takes, it polls throughout. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum state { IDLE, CONNECTING, BUSY, WRITING, CLOSED };

struct conn {
    int fd;
    enum state state;
    int watching_out;  /* epoll also reports room to write: connecting, or part of the request unwritten */
    double due, sent, written;
    size_t wpos;  /* bytes of the current request written so far */
    char *rbuf;
    size_t rlen, rcap;
};

static char *request;
static size_t request_len;
static struct conn *conns;
static size_t nconns, capconns;
static size_t *idle;  /* a stack of connection indices */
static size_t nidle, capidle;
static size_t inflight;  /* CONNECTING or BUSY: a request due and not answered */
static size_t writing;   /* WRITING */
static size_t max_open;
static int ep;
static int port;
static double start;
static long errors, overflow;
static double *records;
static size_t nrecords, caprecords;
static double *late;
static size_t nlate, caplate;
static double late_est = 100e-6;  /* how late timed waits wake: a running 90th percentile */

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9 - start;
}

static void die(const char *what) {
    perror(what);
    exit(2);
}

static void *grow(void *p, size_t *cap, size_t need, size_t size) {
    if (need <= *cap) return p;
    size_t bigger = *cap ? *cap : 64;
    while (bigger < need) bigger *= 2;
    p = realloc(p, bigger * size);
    if (!p) die("realloc");
    *cap = bigger;
    return p;
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) die(path);
    struct stat st;
    if (fstat(fileno(f), &st) < 0) die("fstat");
    char *data = malloc((size_t)st.st_size + 1);
    if (!data) die("malloc");
    if (fread(data, 1, (size_t)st.st_size, f) != (size_t)st.st_size) die("fread");
    fclose(f);
    *len = (size_t)st.st_size;
    return data;
}

static void write_file(const char *path, const double *values, size_t count) {
    FILE *f = fopen(path, "wb");
    if (!f) die(path);
    if (count && fwrite(values, sizeof *values, count, f) != count) die("fwrite");
    if (fclose(f) != 0) die("fclose");
}

static void push_idle(size_t i) {
    idle = grow(idle, &capidle, nidle + 1, sizeof *idle);
    idle[nidle++] = i;
}

/* Watch for room to write (or not): only while connecting or part of the request is unwritten. */
static void watch_out(size_t i, int on) {
    struct conn *c = &conns[i];
    if (c->watching_out == on) return;
    struct epoll_event ev = {.events = EPOLLIN | (on ? EPOLLOUT : 0), .data.u64 = i};
    if (epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev) < 0) die("epoll_ctl");
    c->watching_out = on;
}

/* A new connection: blocking before the step starts; else in progress, its request sent once it is up. */
static long open_conn(int blocking) {
    int fd = socket(AF_INET, SOCK_STREAM | (blocking ? 0 : SOCK_NONBLOCK), 0);
    if (fd < 0) return -1;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int rc = connect(fd, (struct sockaddr *)&addr, sizeof addr);
    if (rc < 0 && !(errno == EINPROGRESS && !blocking)) {
        close(fd);
        return -1;
    }
    if (blocking && fcntl(fd, F_SETFL, O_NONBLOCK) < 0) die("fcntl");
    conns = grow(conns, &capconns, nconns + 1, sizeof *conns);
    size_t i = nconns++;
    int connecting = rc < 0;
    conns[i] = (struct conn){.fd = fd, .state = connecting ? CONNECTING : IDLE, .wpos = request_len,
                             .watching_out = connecting};
    struct epoll_event ev = {.events = EPOLLIN | (connecting ? EPOLLOUT : 0), .data.u64 = i};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0) die("epoll_ctl");
    return (long)i;
}

/* The connection is gone (closed by the server, or an error): a request on it is an error. */
static void lose(size_t i) {
    struct conn *c = &conns[i];
    if (c->state == CLOSED) return;
    if (c->state == BUSY || c->state == CONNECTING) {
        errors++;
        inflight--;
    } else if (c->state == WRITING) {
        writing--;
    } else if (c->state == IDLE) {
        for (size_t k = 0; k < nidle; k++)
            if (idle[k] == i) {
                idle[k] = idle[--nidle];
                break;
            }
    }
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->state = CLOSED;
}

static void write_more(size_t i) {
    struct conn *c = &conns[i];
    while (c->wpos < request_len) {
        ssize_t n = write(c->fd, request + c->wpos, request_len - c->wpos);
        if (n > 0) {
            c->wpos += (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && errno == EAGAIN) {
            break;
        } else {
            lose(i);
            return;
        }
    }
    int done = c->wpos == request_len;
    watch_out(i, !done);
    if (done && c->state == WRITING) {
        c->state = IDLE;
        writing--;
        push_idle(i);
    }
}

static void send_on(size_t i, double due) {
    struct conn *c = &conns[i];
    c->due = due;
    c->state = BUSY;
    c->sent = now();
    ssize_t n = write(c->fd, request, request_len);
    c->written = now();
    if (n == (ssize_t)request_len) {  /* the common case: all of it, nothing more to watch */
        c->wpos = request_len;
        watch_out(i, 0);
        return;
    }
    if (n < 0 && errno != EAGAIN && errno != EINTR) {
        lose(i);
        return;
    }
    c->wpos = n > 0 ? (size_t)n : 0;
    watch_out(i, 1);
}

static void send_due(double due) {
    late = grow(late, &caplate, nlate + 1, sizeof *late);
    late[nlate++] = now() - due;
    if (nidle > 0) {
        inflight++;
        send_on(idle[--nidle], due);
    } else if (inflight + writing < max_open) {
        long i = open_conn(0);
        if (i < 0) {
            errors++;
            return;
        }
        inflight++;
        if (conns[i].state == IDLE)  /* (loopback often connects at once) */
            send_on((size_t)i, due);
        else
            conns[i].due = due;  /* sent once connected */
    } else {
        overflow++;
    }
}

static void connected(size_t i) {
    struct conn *c = &conns[i];
    int error = 0;
    socklen_t len = sizeof error;
    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &error, &len) < 0 || error != 0) {
        lose(i);
        return;
    }
    send_on(i, c->due);
}

/* Complete answers in the buffer: each ends the request in flight on this connection. */
static void answers(size_t i) {
    struct conn *c = &conns[i];
    size_t used = 0;
    for (;;) {
        char *head = c->rbuf + used;
        size_t have = c->rlen - used;
        char *end = memmem(head, have, "\r\n\r\n", 4);
        if (!end) break;
        size_t head_len = (size_t)(end - head) + 4;
        size_t body = 0;
        for (char *p = head; p + 15 <= end; p++) {
            if ((*p == 'c' || *p == 'C') && strncasecmp(p, "content-length:", 15) == 0) {
                body = strtoul(p + 15, NULL, 10);
                break;
            }
        }
        if (have < head_len + body) break;
        int status = have >= 12 ? atoi((char[4]){head[9], head[10], head[11], 0}) : 0;
        used += head_len + body;
        if (c->state != BUSY) continue;  /* an answer to nothing: not counted */
        double done = now();
        records = grow(records, &caprecords, nrecords + 5, sizeof *records);
        double *r = records + nrecords;
        r[0] = c->due, r[1] = c->sent, r[2] = c->written, r[3] = done, r[4] = status;
        nrecords += 5;
        inflight--;
        if (c->wpos < request_len) {
            c->state = WRITING;
            writing++;
        } else {
            c->state = IDLE;
            push_idle(i);
        }
    }
    if (used) {
        memmove(c->rbuf, c->rbuf + used, c->rlen - used);
        c->rlen -= used;
    }
}

static void readable(size_t i) {
    struct conn *c = &conns[i];
    for (;;) {
        c->rbuf = grow(c->rbuf, &c->rcap, c->rlen + 65536, 1);
        size_t room = c->rcap - c->rlen;
        ssize_t n = read(c->fd, c->rbuf + c->rlen, room);
        if (n > 0) {
            c->rlen += (size_t)n;
            if ((size_t)n < room) break;  /* less than there was room for: nothing more to read now */
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) break;
        answers(i);  /* what came before it closed still counts */
        lose(i);
        return;
    }
    answers(i);
}

/* One wait for events (at most ``timeout``; NULL: until one comes), and what they say. Returns how many. */
static int poll_events(const struct timespec *timeout) {
    struct epoll_event events[256];
    int n = epoll_pwait2(ep, events, 256, timeout, NULL);
    if (n < 0) {
        if (errno == EINTR) return 0;
        die("epoll_pwait2");
    }
    for (int k = 0; k < n; k++) {
        size_t i = (size_t)events[k].data.u64;
        uint32_t what = events[k].events;
        if (what & EPOLLOUT) {
            if (conns[i].state == CONNECTING)
                connected(i);
            else if (conns[i].state != CLOSED)
                write_more(i);
        }
        if ((what & (EPOLLIN | EPOLLERR | EPOLLHUP)) && conns[i].state != CLOSED) readable(i);
    }
    return n;
}

static struct timespec span(double seconds) {
    if (seconds < 0) seconds = 0;
    time_t whole = (time_t)seconds;
    return (struct timespec){.tv_sec = whole, .tv_nsec = (long)((seconds - (double)whole) * 1e9)};
}

/* Return at ``due`` (never before), reading answers meanwhile: at least once, even when it is past (a
 * client that fell behind and only sent until it caught up would read no answer, reuse no connection,
 * and open new ones, as costly to the server as to itself). */
static void wait_until(double due) {
    double wake = due - late_est;
    double t = now();
    if (wake > t) {
        int timed_out = 0;
        while ((t = now()) < wake) {
            struct timespec timeout = span(wake - t);
            timed_out = poll_events(&timeout) == 0;
        }
        if (timed_out) {  /* 1.25 up, 1.25^(-1/9) down: settles where a tenth of the wakes are later */
            late_est *= t - wake > late_est ? 1.25 : 0.975512;
        }
    }
    struct timespec zero = {0, 0};
    do poll_events(&zero);
    while (now() < due);
}

int main(int argc, char **argv) {
    if (argc != 9) {
        fprintf(stderr, "usage: %s PORT REQUEST_FILE OFFSETS_FILE DRAIN_S MAX_OPEN CONNECTIONS RECORDS_FILE "
                        "LATE_FILE\n", argv[0]);
        return 2;
    }
    port = atoi(argv[1]);
    request = read_file(argv[2], &request_len);
    size_t offsets_bytes;
    double *offsets = (double *)read_file(argv[3], &offsets_bytes);
    size_t count = offsets_bytes / sizeof(double);
    double drain_s = atof(argv[4]);
    max_open = (size_t)atol(argv[5]);
    long connections = atol(argv[6]);

    prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);  /* timed waits to the nanosecond, not 50 us late */
    struct rlimit files;
    if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
        files.rlim_cur = files.rlim_max;  /* MAX_OPEN connections and then some */
        setrlimit(RLIMIT_NOFILE, &files);
    }
    ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0) die("epoll_create1");
    for (long k = 0; k < connections; k++) {
        long i = open_conn(1);
        if (i < 0) die("connect");
        push_idle((size_t)i);
    }

    start = 0;
    start = now() + 0.01;
    size_t next = 0;
    while (next < count) {
        double t = now();
        while (next < count && offsets[next] <= t) send_due(offsets[next++]);
        if (next < count) wait_until(offsets[next]);
    }
    double deadline = now() + drain_s;
    while (inflight > 0) {
        double left = deadline - now();
        if (left <= 0) break;
        struct timespec timeout = span(left);
        poll_events(&timeout);
    }

    write_file(argv[7], records, nrecords);
    write_file(argv[8], late, nlate);
    struct linger abort_it = {.l_onoff = 1, .l_linger = 0};
    for (size_t i = 0; i < nconns; i++) {
        if (conns[i].state == CLOSED) continue;
        if (conns[i].wpos < request_len)  /* part of a request unwritten: reset, not a wait to write it */
            setsockopt(conns[i].fd, SOL_SOCKET, SO_LINGER, &abort_it, sizeof abort_it);
        close(conns[i].fd);
    }
    struct rusage used;
    getrusage(RUSAGE_SELF, &used);
    double cpu_s = (double)used.ru_utime.tv_sec + (double)used.ru_utime.tv_usec * 1e-6 +
                   (double)used.ru_stime.tv_sec + (double)used.ru_stime.tv_usec * 1e-6;
    printf("%ld %ld %zu %.6f\n", errors, overflow, inflight, cpu_s);
    return 0;
}
