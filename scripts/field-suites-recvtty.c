/* runc's contrib/cmd/recvtty (Go, not in Debian's binary packages) in the one mode runc's
 * integration tests use, `recvtty --pid-file F --mode null SOCKET`: takes each console sent
 * to SOCKET (SCM_RIGHTS) and reads it to nowhere. In C, not a script: the tests start it in
 * the background and connect at once, so it must be listening within milliseconds. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static void *drain(void *p) {
    int fd = (int)(long)p;
    char b[65536];
    while (read(fd, b, sizeof b) > 0)
        ;
    close(fd);
    return 0;
}

int main(int argc, char **argv) {
    const char *pidf = 0, *path = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--pid-file") && i + 1 < argc)
            pidf = argv[++i];
        else if ((!strcmp(argv[i], "--mode") || !strcmp(argv[i], "-m")) && i + 1 < argc) {
            if (strcmp(argv[++i], "null")) {
                fprintf(stderr, "recvtty: only --mode null\n");
                return 2;
            }
        } else if (strcmp(argv[i], "--no-stdin"))
            path = argv[i];
    }
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (!path || strlen(path) >= sizeof a.sun_path) {
        fprintf(stderr, "recvtty: need one socket path\n");
        return 2;
    }
    strcpy(a.sun_path, path);
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 64)) {
        perror("recvtty");
        return 1;
    }
    if (pidf) {
        FILE *f = fopen(pidf, "w");
        if (f) {
            fprintf(f, "%d", (int)getpid());
            fclose(f);
        }
    }
    for (;;) {
        int c = accept(s, 0, 0);
        if (c < 0)
            continue;
        char buf[4096], cm[CMSG_SPACE(sizeof(int) * 4)];
        struct iovec io = {buf, sizeof buf};
        struct msghdr m = {.msg_iov = &io, .msg_iovlen = 1, .msg_control = cm, .msg_controllen = sizeof cm};
        if (recvmsg(c, &m, 0) >= 0)
            for (struct cmsghdr *h = CMSG_FIRSTHDR(&m); h; h = CMSG_NXTHDR(&m, h))
                if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS) {
                    int n = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                    int *fds = (int *)CMSG_DATA(h);
                    for (int k = 0; k < n; k++) {
                        pthread_t t;
                        pthread_create(&t, 0, drain, (void *)(long)fds[k]);
                        pthread_detach(t);
                    }
                }
        close(c);
    }
}
