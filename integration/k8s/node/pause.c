/*
 * The pod sandbox's process for the test bed's node (what the pause image runs): it holds the
 * pod's namespaces, reaps orphans (it is PID 1 of the pod's PID namespace when one is shared),
 * and exits 0 on SIGINT or SIGTERM, which a PID 1 without handlers would ignore.
 *
 * Built statically by integration/k8s/build-node.sh: the image holds nothing else.
 */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int signal) {
    (void)signal;
    _exit(0);
}

static void reap(int signal) {
    (void)signal;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction on_stop = {.sa_handler = stop};
    struct sigaction on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP | SA_RESTART};
    if (sigaction(SIGINT, &on_stop, NULL) != 0 || sigaction(SIGTERM, &on_stop, NULL) != 0 ||
        sigaction(SIGCHLD, &on_child, NULL) != 0) {
        return 1;
    }
    for (;;) {
        pause();
    }
}
