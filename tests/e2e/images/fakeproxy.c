/* fakeproxy: a mesh proxy stand-in for the e2e scenarios (Istio-like or Linkerd-like).
 *
 *   fakeproxy --name NAME --ready-after SECONDS --ready PORT:PATH --quit PORT:PATH
 *             --traffic PORT [--no-quit] [--quit-enabled-by VAR] [--live PATH]
 *
 * - readiness: GET PORT:PATH answers 503 until SECONDS after start, 200 after;
 * - liveness: with --live PATH, GET PORT:PATH (the readiness port) answers 200 from the
 *   start (Linkerd's admin server's /live);
 * - traffic: PORT is bound only once ready (before, a connection is refused, as traffic
 *   is when no proxy runs); each request is logged ("request GET /path") and answered 200;
 * - quit: POST PORT:PATH answers 200 and exits 0 (Istio's /quitquitquit, Linkerd's
 *   /shutdown); with --no-quit it answers 404 and keeps running, and so it does with
 *   --quit-enabled-by VAR unless $VAR is "true" (Linkerd's proxy serves /shutdown only
 *   where LINKERD2_PROXY_SHUTDOWN_ENDPOINT_ENABLED is "true");
 * - SIGTERM exits 0.
 *
 *   fakeproxy await PORT PATH SECONDS
 *
 * polls http://127.0.0.1:PORT/PATH until it answers 200 (exit 0) or SECONDS pass (exit 1);
 *
 *   linkerd-await --timeout=2m --port=PORT     (fakeproxy linked as .../linkerd-await)
 *
 * the same on PORT's /ready for 120 s: the postStart hook Linkerd's proxy.await adds, with
 * its command line. (The real one backs off 1 s between checks; this one polls every 50 ms.)
 * Each event is one line on stdout, "fakeproxy[NAME] EPOCH_MS event"; the kubelet's own log
 * timestamps say when it was written. Static (gcc -static), no libraries. */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static const char *name = "proxy";
static volatile sig_atomic_t terminated;

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static long long mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void event(const char *fmt, const char *arg) {
    printf("fakeproxy[%s] %lld ", name, now_ms());
    printf(fmt, arg);
    printf("\n");
    fflush(stdout);
}

static int listen_on(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    struct sockaddr_in addr = {0};
    if (fd < 0) return -1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons((unsigned short)port);
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(fd, 64) < 0) {
        perror("fakeproxy: bind");
        exit(1);
    }
    return fd;
}

static void split(const char *spec, int *port, char *path, size_t size) {
    const char *colon = strchr(spec, ':');
    *port = atoi(spec);
    snprintf(path, size, "%s", colon ? colon + 1 : "/");
}

static void answer(int fd, int code, const char *reason, const char *body) {
    char buf[512];
    int n = snprintf(buf, sizeof buf,
                     "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n%s",
                     code, reason, strlen(body), body);
    if (write(fd, buf, (size_t)n) < 0) {
        /* the client went away: nothing to do */
    }
}

static int probe_once(int port, const char *path) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in addr = {0};
    char buf[512];
    int ok = 0;
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons((unsigned short)port);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0) {
        int n = snprintf(buf, sizeof buf, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", path);
        if (write(fd, buf, (size_t)n) == n) {
            ssize_t r = read(fd, buf, sizeof buf - 1);
            if (r > 12) {
                buf[r] = 0;
                ok = !strncmp(buf + 9, "200", 3);
            }
        }
    }
    if (fd >= 0) close(fd);
    return ok;
}

static int await_ready(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: fakeproxy await PORT PATH SECONDS\n");
        return 2;
    }
    long long deadline = mono_ms() + (long long)(atof(argv[4]) * 1000);
    struct timespec pause_50ms = {0, 50 * 1000000};
    while (mono_ms() < deadline) {
        if (probe_once(atoi(argv[2]), argv[3])) return 0;
        nanosleep(&pause_50ms, NULL);
    }
    fprintf(stderr, "fakeproxy await: %s:%s not ready after %s s\n", argv[2], argv[3], argv[4]);
    return 1;
}

static void on_term(int sig) {
    (void)sig;
    terminated = 1;
}

int main(int argc, char **argv) {
    double ready_after = 0;
    int ready_port = 0, quit_port = 0, traffic_port = 0, can_quit = 1;
    char ready_path[256] = "/", quit_path[256] = "/";
    const char *live_path = NULL;
    if (argc > 1 && !strcmp(argv[1], "await")) return await_ready(argc, argv);
    const char *self = strrchr(argv[0], '/');
    if (!strcmp(self ? self + 1 : argv[0], "linkerd-await")) {
        char *args[] = {argv[0], "await", "4191", "/ready", "120", NULL};
        for (int i = 1; i < argc; i++)
            if (!strncmp(argv[i], "--port=", 7)) args[2] = argv[i] + 7;
        return await_ready(5, args);
    }
    for (int i = 1; i < argc; i++) {
        const char *next = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(argv[i], "--name")) name = next, i++;
        else if (!strcmp(argv[i], "--ready-after")) ready_after = atof(next), i++;
        else if (!strcmp(argv[i], "--ready")) split(next, &ready_port, ready_path, sizeof ready_path), i++;
        else if (!strcmp(argv[i], "--quit")) split(next, &quit_port, quit_path, sizeof quit_path), i++;
        else if (!strcmp(argv[i], "--traffic")) traffic_port = atoi(next), i++;
        else if (!strcmp(argv[i], "--no-quit")) can_quit = 0;
        else if (!strcmp(argv[i], "--live")) live_path = next, i++;
        else if (!strcmp(argv[i], "--quit-enabled-by")) {
            const char *on = getenv(next);
            if (!on || strcmp(on, "true")) can_quit = 0;
            i++;
        }
        else {
            fprintf(stderr, "fakeproxy: unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    int ports[3] = {ready_port, quit_port != ready_port ? quit_port : 0, 0};
    struct pollfd fds[3];
    int nfds = 0;
    for (int i = 0; i < 2; i++)
        if (ports[i] > 0) {
            fds[nfds].fd = listen_on(ports[i]);
            fds[nfds].events = POLLIN;
            ports[nfds++] = ports[i];
        }
    char delay[32];
    snprintf(delay, sizeof delay, "%.3f", ready_after);
    event("started, ready in %s s", delay);
    long long ready_at = mono_ms() + (long long)(ready_after * 1000);
    int ready = 0;
    while (!terminated) {
        long long left = ready ? -1 : ready_at - mono_ms();
        if (!ready && left <= 0) {
            ready = 1;
            if (traffic_port > 0) {
                fds[nfds].fd = listen_on(traffic_port);
                fds[nfds].events = POLLIN;
                ports[nfds++] = traffic_port;
            }
            event("ready%s", "");
            continue;
        }
        int n = poll(fds, (nfds_t)nfds, left < 0 ? -1 : (int)left);
        if (n < 0) {
            if (errno == EINTR) continue;
            perror("fakeproxy: poll");
            return 1;
        }
        for (int i = 0; i < nfds; i++) {
            if (!(fds[i].revents & POLLIN)) continue;
            int c = accept4(fds[i].fd, NULL, NULL, SOCK_CLOEXEC);
            if (c < 0) continue;
            struct timeval tv = {2, 0};
            setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
            char req[4096] = {0}, method[16] = {0}, path[1024] = {0};
            size_t got = 0;
            while (got < sizeof req - 1 && !strstr(req, "\r\n\r\n")) {
                ssize_t r = read(c, req + got, sizeof req - 1 - got);
                if (r <= 0) break;
                got += (size_t)r;
            }
            if (sscanf(req, "%15s %1023s", method, path) != 2) {
                close(c);
                continue;
            }
            char *query = strchr(path, '?');
            if (query) *query = 0;
            int port = ports[i];
            if (port == traffic_port) {
                char line[1100];
                snprintf(line, sizeof line, "%s %s", method, path);
                event("request %s", line);
                char body[1100];
                snprintf(body, sizeof body, "proxied %s\n", path);
                answer(c, 200, "OK", body);
            } else if (port == quit_port && !strcmp(path, quit_path) && !strcmp(method, "POST")) {
                if (can_quit) {
                    answer(c, 200, "OK", "bye\n");
                    close(c);
                    event("quit requested on %s", quit_path);
                    return 0;
                }
                event("quit refused on %s (no quit endpoint)", quit_path);
                answer(c, 404, "Not Found", "no quit endpoint\n");
            } else if (port == ready_port && live_path && !strcmp(path, live_path)) {
                answer(c, 200, "OK", "live\n");
            } else if (port == ready_port && !strcmp(path, ready_path)) {
                if (ready) answer(c, 200, "OK", "ready\n");
                else answer(c, 503, "Service Unavailable", "not ready\n");
            } else {
                answer(c, 404, "Not Found", "not found\n");
            }
            close(c);
        }
    }
    event("terminated by %s", "SIGTERM");
    return 0;
}
