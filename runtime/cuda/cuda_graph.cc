// defines: CudaBackend::begin_capture, end_capture, replay, refuse_in_capture, destroy_graphs
// (cuda_backend.h, "CUDA graphs"): stream capture of the compute stream into executable graphs,
// the mechanism behind Plan::cuda_graphs (Megatron's full_iteration / Transformer Engine's
// per-layer graphs) on parasol's CUDA backend.
#include <string>

#include "core/error.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/cuda_check.h"

namespace parasol::runtime {

void CudaBackend::begin_capture() {
  if (capturing_) throw Error("runtime.cuda.graph", "begin_capture() while already capturing");
  PARASOL_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  capturing_ = true;
}

int CudaBackend::end_capture() {
  if (!capturing_) throw Error("runtime.cuda.graph", "end_capture() without begin_capture()");
  capturing_ = false;
  cudaGraph_t graph = nullptr;
  PARASOL_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t st = cudaGraphInstantiateWithFlags(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (st != cudaSuccess) {
    (void)cudaGetLastError();
    throw Error("runtime.cuda.graph",
                std::string("cudaGraphInstantiate: ") + cudaGetErrorString(st));
  }
  graph_execs_.push_back(exec);
  return static_cast<int>(graph_execs_.size()) - 1;
}

void CudaBackend::replay(int graph) {
  if (graph < 0 || graph >= static_cast<int>(graph_execs_.size()) || !graph_execs_[graph])
    throw Error("runtime.cuda.graph", "no graph " + std::to_string(graph));
  if (capturing_) refuse_in_capture("replay() of another graph");
  PARASOL_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph_execs_[graph]), stream_));
  ++graph_replays_;
}

void CudaBackend::refuse_in_capture(const std::string& call) {
  capturing_ = false;
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(stream_, &graph);  // ends the (possibly invalidated) capture
  if (graph) cudaGraphDestroy(graph);
  (void)cudaGetLastError();
  throw Error("runtime.cuda.graph",
              call +
                  " cannot be recorded in a CUDA graph: the capture is abandoned (warm the "
                  "step up first, and keep host copies outside the captured region)");
}

void CudaBackend::destroy_graphs() {
  for (void* e : graph_execs_)
    if (e) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(e));
  graph_execs_.clear();
}

}  // namespace parasol::runtime
