#define _GNU_SOURCE
/* A hostile child for the trust-boundary tests: it speaks raw bytes on the
 * channel the supervisor gave it (descriptor 3), as an attacker inside a
 * confined agent would. Built by the tests with the system C compiler.
 *
 *   child fds N    N ping frames, each carrying 8 descriptors (SCM_RIGHTS),
 *                  then one plain ping; prints the errors and answers seen.
 *   child flood N  N ping frames without ever reading, then waits for the
 *                  supervisor to hang up (prints "closed") or 20 s.
 *   child swap A B S   exchange paths A and B (renameat2 RENAME_EXCHANGE)
 *                  in a loop for S seconds; prints how many swaps.
 *   child fifo P S     make P a FIFO and a regular file in turn for S
 *                  seconds; prints how many FIFOs were made.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static const int CH = 3;

static void send_with_fds(const char *frame, int fd) {
    int fds[8];
    for (int i = 0; i < 8; i++) fds[i] = fd;
    char control[CMSG_SPACE(sizeof fds)];
    memset(control, 0, sizeof control);
    struct iovec iov = {.iov_base = (void *)frame, .iov_len = strlen(frame)};
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof fds);
    memcpy(CMSG_DATA(c), fds, sizeof fds);
    /* Descriptors in flight count against the sender's limit: when the
     * supervisor has not taken them yet, wait a little and try again. */
    for (int tries = 0; sendmsg(CH, &msg, MSG_NOSIGNAL) < 0; tries++) {
        if ((errno != ETOOMANYREFS && errno != EAGAIN) || tries > 5000) {
            perror("sendmsg");
            exit(2);
        }
        usleep(1000);
    }
}

/* Lines read so far, and how many refusals of descriptors they held. */
static char acc[1 << 20];
static size_t acc_len;
static int refusals;

/* Read what is there (waiting up to `wait_ms`), count refusals; 1 when a
 * line containing `want` was seen, -1 when the supervisor hung up. */
static int consume(int wait_ms, const char *want) {
    struct pollfd p = {.fd = CH, .events = POLLIN};
    if (poll(&p, 1, wait_ms) <= 0) return 0;
    ssize_t n = recv(CH, acc + acc_len, sizeof acc - acc_len - 1, MSG_DONTWAIT);
    if (n == 0) return -1;
    if (n < 0) return errno == EAGAIN ? 0 : -1;
    acc_len += (size_t)n;
    acc[acc_len] = 0;
    int seen = 0;
    char *start = acc, *nl;
    while ((nl = strchr(start, '\n'))) {
        *nl = 0;
        if (strstr(start, "descriptors")) refusals++;
        if (want && strstr(start, want)) seen = 1;
        start = nl + 1;
    }
    acc_len = strlen(start);
    memmove(acc, start, acc_len + 1);
    return seen;
}

static int race_swap(const char *a, const char *b, long seconds) {
    time_t until = time(NULL) + seconds;
    long swaps = 0;
    while (time(NULL) < until) {
        /* renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) */
        if (syscall(SYS_renameat2, AT_FDCWD, a, AT_FDCWD, b, 2) == 0) swaps++;
    }
    printf("swaps=%ld\n", swaps);
    return 0;
}

static int race_fifo(const char *path, long seconds) {
    time_t until = time(NULL) + seconds;
    long fifos = 0;
    while (time(NULL) < until) {
        unlink(path);
        if (mkfifo(path, 0644) == 0) fifos++;
        usleep(200);
        unlink(path);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            if (write(fd, "x\n", 2) < 0) perror("write");
            close(fd);
        }
        usleep(200);
    }
    printf("fifos=%ld\n", fifos);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 5 && strcmp(argv[1], "swap") == 0) return race_swap(argv[2], argv[3], atol(argv[4]));
    if (argc >= 4 && strcmp(argv[1], "fifo") == 0) return race_fifo(argv[2], atol(argv[3]));
    if (argc < 3) return 64;
    long n = atol(argv[2]);
    if (strcmp(argv[1], "fds") == 0) {
        int fd = open("/dev/null", O_RDONLY);
        for (long i = 0; i < n; i++) {
            char frame[128];
            snprintf(frame, sizeof frame,
                     "{\"type\":\"request\",\"id\":%ld,\"method\":\"ping\"}\n", i + 1);
            send_with_fds(frame, fd);
            /* Read the refusals as they come: a child that never reads is
             * cut off, which is another test. */
            if (consume(0, NULL) < 0) {
                printf("hung up after %ld\n", i + 1);
                return 4;
            }
        }
        const char *last = "{\"type\":\"request\",\"id\":999999,\"method\":\"ping\"}\n";
        if (send(CH, last, strlen(last), MSG_NOSIGNAL) < 0) return 3;
        time_t until = time(NULL) + 10;
        for (;;) {
            int r = consume(100, "\"id\":999999");
            if (r == 1) break;
            if (r < 0 || time(NULL) > until) {
                printf("no answer\n");
                return 4;
            }
        }
        printf("refused=%d answered\n", refusals);
        return 0;
    }
    if (strcmp(argv[1], "flood") == 0) {
        int flags = fcntl(CH, F_GETFL);
        fcntl(CH, F_SETFL, flags | O_NONBLOCK);
        const char *ping = "{\"type\":\"request\",\"id\":1,\"method\":\"ping\"}\n";
        size_t plen = strlen(ping);
        long sent = 0;
        time_t until = time(NULL) + 20;
        while (sent < n && time(NULL) < until) {
            ssize_t w = send(CH, ping, plen, MSG_NOSIGNAL);
            if (w == (ssize_t)plen) {
                sent++;
            } else if (w < 0 && errno == EAGAIN) {
                struct pollfd p = {.fd = CH, .events = POLLOUT};
                poll(&p, 1, 100);
            } else if (w < 0 && (errno == EPIPE || errno == ECONNRESET)) {
                printf("closed sent=%ld\n", sent);
                return 0;
            } else if (w < 0) {
                perror("send");
                return 2;
            } else {
                return 5; /* a torn frame: never happens on a stream socket's first bytes */
            }
        }
        /* Never read; wait for the supervisor to close its end. */
        while (time(NULL) < until) {
            char b[1 << 16];
            struct pollfd p = {.fd = CH, .events = POLLRDHUP};
            if (poll(&p, 1, 100) > 0 && (p.revents & (POLLRDHUP | POLLHUP))) {
                printf("closed sent=%ld\n", sent);
                return 0;
            }
            (void)b;
        }
        printf("open sent=%ld\n", sent);
        return 1;
    }
    return 64;
}
