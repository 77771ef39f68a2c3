/*
 * The pod sandbox ("pause") process of the harness's sandbox image, built
 * statically by tessera-e2e: it holds the pod's namespaces, reaps orphans
 * and exits on SIGINT or SIGTERM.
 */
#include <signal.h>
#include <unistd.h>
#include <stdlib.h>
#include <sys/wait.h>
static void die(int s){(void)s; _exit(0);}
static void reap(int s){(void)s; while (waitpid(-1, NULL, WNOHANG) > 0);}
int main(void){
  struct sigaction a = {0}; a.sa_handler = die;
  sigaction(SIGINT,&a,NULL); sigaction(SIGTERM,&a,NULL);
  struct sigaction c = {0}; c.sa_handler = reap; c.sa_flags = SA_NOCLDSTOP;
  sigaction(SIGCHLD,&c,NULL);
  for(;;) pause();
}
