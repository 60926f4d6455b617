// How many thread-block clusters a GPU runs at once, by cluster size and shared memory per block
// (cudaOccupancyMaxActiveClusters), and which multiprocessors clusters of 16 and 8 blocks ever
// reach (a cluster stays in one GPC: SMs that share a cluster share a GPC).
//
//   nvcc -arch=sm_90 -o cluster_placement benchmarks/sweeps/cluster_placement.cu && ./cluster_placement
//
// results/batch_norm/cluster_placement_nvidia_h200.txt
#include <cstdio>
#include <vector>
#include <set>
#include <map>
#include <cooperative_groups.h>
namespace cg = cooperative_groups;

__global__ void where(int* smid, int* cluster_of) {
  extern __shared__ char pad[];
  unsigned sm; asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  int b = blockIdx.x;
  smid[b] = sm;
  cluster_of[b] = b / cg::this_cluster().num_blocks();
  if (threadIdx.x == 0) pad[0] = 1;
  cg::this_cluster().sync();
}

int main() {
  cudaDeviceProp p; cudaGetDeviceProperties(&p, 0);
  printf("device %s, %d SMs, smem per SM %zu, per block optin %zu\n", p.name,
         p.multiProcessorCount, p.sharedMemPerMultiprocessor, p.sharedMemPerBlockOptin);
  cudaFuncSetAttribute(where, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  cudaFuncSetAttribute(where, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
  int sizes[] = {1, 2, 4, 8, 12, 14, 16};
  int smems[] = {48, 64, 76, 100, 113, 200};
  printf("max active clusters (blocks of 512 threads) | smem KB:");
  for (int s : smems) printf(" %d", s);
  printf("\n");
  for (int size : sizes) {
    printf("cluster %2d:", size);
    for (int s : smems) {
      cudaLaunchConfig_t cfg = {};
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeClusterDimension;
      attr[0].val.clusterDim.x = size; attr[0].val.clusterDim.y = 1; attr[0].val.clusterDim.z = 1;
      cfg.gridDim = dim3(size * 256); cfg.blockDim = dim3(512);
      cfg.dynamicSmemBytes = s * 1024; cfg.attrs = attr; cfg.numAttrs = 1;
      int n = -1;
      cudaError_t e = cudaOccupancyMaxActiveClusters(&n, (void*)where, &cfg);
      if (e != cudaSuccess) printf(" err(%s)", cudaGetErrorString(e));
      else printf(" %d (%d blocks)", n, n * size);
    }
    printf("\n");
  }
  // GPCs: launch one wave of 16-block clusters at 200 KB (one block per SM); SMs of a cluster
  // share a GPC; union over clusters.
  for (int size : {16, 8}) {
    int blocks = size * 64;
    int *smid, *cl;
    cudaMallocManaged(&smid, blocks * sizeof(int)); cudaMallocManaged(&cl, blocks * sizeof(int));
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = size; attr[0].val.clusterDim.y = 1; attr[0].val.clusterDim.z = 1;
    cfg.gridDim = dim3(blocks); cfg.blockDim = dim3(512); cfg.dynamicSmemBytes = 200 * 1024;
    cfg.attrs = attr; cfg.numAttrs = 1;
    cudaError_t e = cudaLaunchKernelEx(&cfg, where, smid, cl);
    cudaDeviceSynchronize();
    if (e != cudaSuccess) { printf("launch %d: %s\n", size, cudaGetErrorString(e)); continue; }
    std::vector<int> parent(p.multiProcessorCount);
    for (int i = 0; i < (int)parent.size(); i++) parent[i] = i;
    auto find = [&](int a) { while (parent[a] != a) a = parent[a] = parent[parent[a]]; return a; };
    for (int b = 0; b < blocks; b++) parent[find(smid[b])] = find(smid[(b / size) * size]);
    std::map<int, std::set<int>> gpc;
    std::set<int> used;
    for (int b = 0; b < blocks; b++) { gpc[find(smid[b])].insert(smid[b]); used.insert(smid[b]); }
    printf("cluster %d at 200 KB: %zu SMs ever used; groups of SMs sharing clusters:", size, used.size());
    for (auto& [k, v] : gpc) printf(" %zu", v.size());
    printf("\n");
  }
  return 0;
}
