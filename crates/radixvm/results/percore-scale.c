// Scaling of the per-core backend's kernel path alone (radixvm percore, issue 20):
// P pinned processes, each in a loop: install (mmap MAP_FIXED|MAP_POPULATE of memfd pages,
// one page at a time, or the 4 pages at once with AROUND=1), store, munmap the 4 pages.
// MODE 0: one memfd shared by all; 1: one memfd per process; 2: anonymous private (control).
// Prints total iterations/s and CPU us per iteration (CLOCK_PROCESS_CPUTIME_ID, mean of P).
// cc -O2 -o scale percore-scale.c && chrt -f 1 ./scale P MODE SECS [AROUND]
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#define PG 4096UL
static double now(clockid_t c){struct timespec t;clock_gettime(c,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  int P=atoi(argv[1]), mode=atoi(argv[2]); double secs=atof(argv[3]); int around=argc>4?atoi(argv[4]):0;
  int shared=memfd_create("pool",0); ftruncate(shared,64<<20);
  char*pre=mmap(0,64<<20,PROT_READ|PROT_WRITE,MAP_SHARED,shared,0); for(long i=0;i<(64<<20)/PG;i++)pre[i*PG]=0;
  char*arena=mmap((void*)0x100000000000UL,1UL<<36,PROT_NONE,MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE,-1,0);
  double *res=mmap(0,4096,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_ANONYMOUS,-1,0);
  volatile int *go=(int*)(res+256);
  for(int p=0;p<P;p++) if(!fork()){
    cpu_set_t s; CPU_ZERO(&s); CPU_SET(p,&s); sched_setaffinity(0,sizeof s,&s);
    int fd=shared; long base=p*(8<<20);
    if(mode==1){ fd=memfd_create("mine",0); ftruncate(fd,8<<20); char*q=mmap(0,8<<20,PROT_READ|PROT_WRITE,MAP_SHARED,fd,0); for(long i=0;i<(8<<20)/PG;i++)q[i*PG]=0; base=0; }
    char*r=arena+((unsigned long)p<<32);
    __sync_fetch_and_add(go,1); while(*go<P);
    double t0=now(CLOCK_MONOTONIC), c0=now(CLOCK_PROCESS_CPUTIME_ID); long it=0; long off=0;
    while(now(CLOCK_MONOTONIC)-t0<secs){
      for(int k=0;k<64;k++){
        if(around){ if(mode==2) mmap(r,4*PG,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS|MAP_FIXED|MAP_POPULATE,-1,0);
                    else mmap(r,4*PG,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_FIXED|MAP_POPULATE,fd,base+off*PG);
                    for(int i=0;i<4;i++) r[i*PG]=1; }
        else for(int i=0;i<4;i++){
          if(mode==2) mmap(r+i*PG,PG,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS|MAP_FIXED|MAP_POPULATE,-1,0);
          else mmap(r+i*PG,PG,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_FIXED|MAP_POPULATE,fd,base+(off+i)*PG);
          r[i*PG]=1; }
        munmap(r,4*PG); off=(off+4)%1024; it++;
      }
    }
    double c=now(CLOCK_PROCESS_CPUTIME_ID)-c0, t=now(CLOCK_MONOTONIC)-t0;
    res[2*p]=it/t; res[2*p+1]=c/it*1e6; _exit(0);
  }
  for(int p=0;p<P;p++) wait(0);
  double tot=0,cpu=0; for(int p=0;p<P;p++){tot+=res[2*p];cpu+=res[2*p+1]/P;}
  printf("P=%d mode=%d around=%d iters/s %.0f cpu_us/it %.2f\n",P,mode,around,tot,cpu);
}
