/* The pod sandbox's pause process: PID 1 of the pod, reaps orphans, exits 0 on
 * SIGINT/SIGTERM. Built with `gcc -static` into the cluster's own pause image. */
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

static void down(int sig) { (void)sig; _exit(0); }

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction sa = {0};
    sa.sa_handler = down;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sa.sa_handler = reap;
    sa.sa_flags = SA_NOCLDSTOP;
    sigaction(SIGCHLD, &sa, NULL);
    if (getpid() != 1) fprintf(stderr, "pause: not PID 1\n");
    for (;;) pause();
}
