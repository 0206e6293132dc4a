// Times the phases of a per-core-MMU fault (radixvm percore backend) alone:
// SIGSEGV delivery, install mmap of a memfd page, sigreturn + retried store,
// unmap of a 4-page region; and a native anonymous 4-page iteration.
// cc -O2 -o phases percore-phases.c && taskset -c 1 ./phases POPULATE AROUND HOLE
//   POPULATE 0/1: MAP_POPULATE on install; AROUND 0/1: one mmap of the 4 pages
//   at the first fault; HOLE 0/1: unmap with munmap (else mmap PROT_NONE).
// Medians in microseconds, wall clock.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#define PG 4096UL
#define N 20000
static inline double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
static char *arena,*r; static int fd, populate, around, hole;
static volatile double t_before, t_hstart, t_hend;
static double dv[N*4], di[N*4], dr[N*4], du[N], dn[N], dm[N*4], dmi[N*4], dnu[N]; static int nf;
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
static double med(double*a,int n){qsort(a,n,sizeof(double),cmp);return a[n/2]/1e3;}
static void h(int s, siginfo_t*si, void*uc){
  t_hstart=now();
  char*a=(char*)((unsigned long)si->si_addr&~(PG-1));
  long pg=(a-r)/PG;
  double t1=now();
  if(around) mmap(r,4*PG,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_FIXED|(populate?MAP_POPULATE:0),fd,0);
  else mmap(a,PG,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_FIXED|(populate?MAP_POPULATE:0),fd,pg*PG);
  di[nf]=now()-t1;
  t_hend=now();
}
int main(int argc,char**argv){
  if(argc<4){fprintf(stderr,"usage: phases POPULATE AROUND HOLE\n");return 2;}
  populate=atoi(argv[1]); around=atoi(argv[2]); hole=atoi(argv[3]);
  fd=memfd_create("f",0); ftruncate(fd,1<<20);
  char*pre=mmap(0,1<<20,PROT_READ|PROT_WRITE,MAP_SHARED,fd,0); for(int i=0;i<256;i++)pre[i*PG]=1;
  arena=mmap(0,1UL<<34,PROT_NONE,MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE,-1,0);
  struct sigaction sa={0}; sa.sa_sigaction=h; sa.sa_flags=SA_SIGINFO|SA_NODEFER; sigaction(SIGSEGV,&sa,0);
  r=arena+(1UL<<32);
  for(int i=0;i<N;i++){
    for(int p=0;p<4;p++){ t_hend=0; t_before=now(); ((volatile char*)r)[p*PG]=1; double t=now();
      if(t_hend){ dv[nf]=t_hstart-t_before; dr[nf]=t-t_hend; nf++; } }
    double u=now();
    if(hole) munmap(r,4*PG); else mmap(r,4*PG,PROT_NONE,MAP_PRIVATE|MAP_ANONYMOUS|MAP_FIXED|MAP_NORESERVE,-1,0);
    du[i]=now()-u;
  }
  // minor fault alone on a memfd page installed without populate
  for(int i=0;i<N;i++){ double t=now(); mmap(r,PG,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_FIXED,fd,0); dmi[i]=now()-t; t=now(); ((volatile char*)r)[0]=1; dm[i]=now()-t;
    mmap(r,PG,PROT_NONE,MAP_PRIVATE|MAP_ANONYMOUS|MAP_FIXED|MAP_NORESERVE,-1,0);}
  for(int i=0;i<N;i++){ double t=now(); char*x=mmap(0,4*PG,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0); for(int p=0;p<4;p++)x[p*PG]=1; double t2=now(); munmap(x,4*PG); dnu[i]=now()-t2; dn[i]=now()-t;}
  printf("hole=%d populate=%d around=%d faults/it=%.2f | medians us: deliver %.2f install %.2f return+retry %.2f unmap(4p) %.2f | minor-fault-alone %.2f install-nopop-alone %.2f | native it %.2f (munmap %.2f)\n",
    hole,populate,around,(double)nf/N,med(dv,nf),med(di,nf),med(dr,nf),med(du,N),med(dm,N),med(dmi,N),med(dn,N),med(dnu,N));
}
