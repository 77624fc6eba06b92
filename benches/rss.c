/* RSS trampoline for benches/hook.rs: runs ARGV[1..] as a child forked from this tiny
 * process, waits with wait4 and prints the child's peak RSS ("maxrss_kb=N"). A child spawned
 * straight from the (large) benchmark process would report the benchmark's size. */
#include <stdio.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    pid_t p = fork();
    if (p < 0) return 2;
    if (p == 0) {
        execv(argv[1], argv + 1);
        _exit(127);
    }
    int st = 0;
    struct rusage ru;
    if (wait4(p, &st, 0, &ru) < 0) return 2;
    printf("maxrss_kb=%ld\n", ru.ru_maxrss);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}
