/*
 * The sandbox ("pause") process of the tpusim real node's pods.
 *
 * Test infrastructure, built by tpusim.realnode with `gcc -Os -static` into a
 * `localhost/pause:3.10` image so no registry is needed. It holds the pod's
 * namespaces open: it sleeps in pause() until SIGINT or SIGTERM, and as PID 1
 * of the pod's PID namespace it reaps any child that is reparented to it.
 */
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int signo) {
    (void)signo;
    _exit(0);
}

static void on_child(int signo) {
    int saved = errno;
    (void)signo;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    errno = saved;
}

static void handle(int signo, void (*fn)(int), int flags) {
    struct sigaction act;
    memset(&act, 0, sizeof act);
    act.sa_handler = fn;
    act.sa_flags = flags;
    sigemptyset(&act.sa_mask);
    sigaction(signo, &act, NULL);
}

int main(void) {
    handle(SIGINT, on_stop, 0);
    handle(SIGTERM, on_stop, 0);
    handle(SIGCHLD, on_child, SA_NOCLDSTOP | SA_RESTART);
    for (;;) {
        pause();
    }
}
