/* Hermetic stand-in for CUDA's cuda_runtime_api.h: only what cudnn.h uses.
 * ABI-equivalent to the real header for these types (see shared/research/headers.md section 5). */
#ifndef PYCUDNN_STUB_CUDA_RUNTIME_API_H
#define PYCUDNN_STUB_CUDA_RUNTIME_API_H
#include <stddef.h> /* the real header reaches size_t through builtin_types.h */
#include "library_types.h"
typedef struct CUstream_st *cudaStream_t;
typedef struct CUgraph_st *cudaGraph_t;
#endif
